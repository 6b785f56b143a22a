"""A trial's folder decides what the trial does: finished -> skipped, no training (no Ray here)."""

from __future__ import annotations

import json

import pytest

from vagent.sweep.runner import execute_trial
from vagent.sweep.spec import Trial


def test_a_finished_trial_is_skipped_and_a_stray_folder_removed(tmp_path):
    trial = Trial("row", 3, {"seed": 3})
    run = tmp_path / "trials" / "row" / "seed_3" / "row-s3-20260101-000000"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text("seed: 3\n")
    (run / "summary.json").write_text(json.dumps({"run_dir": str(run), "wall_time_s": 12.5}))
    stray = run.parent / "row-s3-20260101-000001"  # killed before it wrote config.yaml
    stray.mkdir()
    assert execute_trial(tmp_path, trial) == {"run_dir": str(run), "wall_time_s": 12.5}
    assert not stray.exists()
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [(e["trial"], e["event"], e["run_dir"]) for e in events] == [("row/seed_3", "skip", str(run))]


def test_two_run_directories_in_one_trial_are_an_error(tmp_path):
    for stamp in ("000000", "000001"):
        run = tmp_path / "trials" / "row" / "seed_0" / f"row-s0-20260101-{stamp}"
        run.mkdir(parents=True)
        (run / "config.yaml").write_text("seed: 0\n")
    with pytest.raises(RuntimeError, match="2 run directories in .* a trial has one. Delete the ones you do not want"):
        execute_trial(tmp_path, Trial("row", 0, {"seed": 0}))
