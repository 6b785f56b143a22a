"""metrics.jsonl: documented prefixes only, non-finite values kept visible, resume truncation,
TensorBoard events written."""

from __future__ import annotations

import math

import pytest

from vagent.runs.metrics import MetricsLogger, read_metrics


def test_log_and_read(tmp_path):
    log = MetricsLogger(tmp_path, tensorboard=True)
    log.log(0, {"sft/loss": 2.0}, phase="sft")
    log.log(0, {"reward/mean": 0.5, "loss/policy": float("nan")})
    log.close()
    recs = read_metrics(tmp_path / "metrics.jsonl")
    assert [(r["phase"], r["step"]) for r in recs] == [("sft", 0), ("rl", 0)]
    assert recs[1]["reward/mean"] == 0.5 and recs[1]["loss/policy"] == "nan"
    assert list(tmp_path.glob("events.out.tfevents.*")), "no TensorBoard events file"


def test_undocumented_prefix_raises(tmp_path):
    log = MetricsLogger(tmp_path, tensorboard=False)
    with pytest.raises(ValueError, match="no documented prefix"):
        log.log(0, {"misc_value": 1.0})


def test_truncate_after_resume_point(tmp_path):
    # records as a run writes them: step k = after k updates, validation at RL step 0 and after updates
    log = MetricsLogger(tmp_path, tensorboard=False)
    for s in range(1, 4):
        log.log(s, {"sft/loss": 1.0 / s}, phase="sft")
    log.log(0, {"val/success_rate": 0.0})
    for s in range(1, 6):
        log.log(s, {"reward/mean": float(s)})
        log.log(s, {"val/success_rate": s / 10})
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"phase": "rl", "step": 6, "rew')  # a line torn by SIGKILL
    # checkpoint rl step 3 was written after update 3's record and the validation after it
    assert log.truncate_after(("sft", "rl"), "rl", 3) == 4
    recs = read_metrics(tmp_path / "metrics.jsonl")
    assert [(r["phase"], r["step"]) for r in recs] == [
        ("sft", 1), ("sft", 2), ("sft", 3), ("rl", 0), ("rl", 1), ("rl", 1), ("rl", 2), ("rl", 2), ("rl", 3), ("rl", 3)]
    # resuming an unfinished SFT phase (checkpoint sft step 1) drops every RL record and the later SFT ones
    log.truncate_after(("sft", "rl"), "sft", 1)
    assert [(r["phase"], r["step"]) for r in read_metrics(tmp_path / "metrics.jsonl")] == [("sft", 1)]
    # no checkpoint at all: nothing is kept
    log.truncate_after(("sft", "rl"), "sft", 0)
    assert read_metrics(tmp_path / "metrics.jsonl") == []
    assert not math.isnan(recs[0]["sft/loss"])


def test_truncate_after_cuts_in_place_and_drops_a_torn_last_line(tmp_path):
    """Resuming on a full disk: cutting metrics.jsonl back writes nothing new (the file is cut in
    place), and a record torn by the full disk or a kill is dropped."""
    import json
    import os

    from vagent.runs.metrics import MetricsLogger

    logger = MetricsLogger(tmp_path, tensorboard=False)
    for step in (1, 2, 3):
        logger.log(step, {"reward/mean": float(step)})
    with open(logger.path, "a") as f:
        f.write('{"phase": "rl", "step": 4, "rew')  # torn
    inode = os.stat(logger.path).st_ino
    assert logger.truncate_after(("sft", "rl"), "rl", 2) == 1
    assert os.stat(logger.path).st_ino == inode  # the same file, cut: no second copy was written
    assert [json.loads(x)["step"] for x in logger.path.read_text().splitlines()] == [1, 2]
    logger.log(3, {"reward/mean": 3.0})
    assert [json.loads(x)["step"] for x in logger.path.read_text().splitlines()] == [1, 2, 3]
