"""Issue 47, item 11: a ``rollout.overlap: 1`` run SIGKILLed right after a checkpoint and resumed
should equal the uninterrupted run record for record (timings aside).

It does not yet: at a checkpoint after step k the rollout of step k+1 is in flight on the weights
before update k (version k); the resumed run samples step k+1 with the checkpoint's weights
(version k+1), so ``rollout/weights_version``, ``rollout/weights_lag``, the ratio and everything
after differ. The test is a strict xfail that records the finding: it starts passing (and then
fails as XPASS) when the in-flight weights (or the in-flight batch) are saved with the checkpoint."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.distributed.conftest import SMALL, metrics, run_job, tiny_vlm_dir, train, train_cmd  # noqa: F401 (fixture)

pytest.importorskip("ray", reason="overlap needs engine replicas: pip install 'vagent[ray]'")

OVERLAP = ["steps=4", "rollout.replicas=1", "rollout.overlap=1", "ppo.critic_backbone=separate",
           "update.kl_coef=0", "rollout.temperature=1.0"]


def _comparable(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "time" and not k.startswith("perf/") and not k.endswith("_s")}
            for r in records]


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.xfail(strict=True, reason="issue 47 item 11: the in-flight rollout of an overlap-1 run is not saved "
                   "with the checkpoint, so the resumed step samples with newer weights")
def test_a_resumed_overlap_run_equals_the_uninterrupted_one(tmp_path: Path, tiny_vlm_dir: Path, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    full = train(tmp_path, tiny_vlm_dir, None, "full", *OVERLAP, timeout=400)
    out = tmp_path / "cut"
    cmd = train_cmd(None, *SMALL, f"out_dir={out}", f"model.path={tiny_vlm_dir}", "model.cache_dir=UNUSED", *OVERLAP)
    job = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1"))
    try:
        deadline = time.time() + 400
        while not list(out.glob("*/checkpoints/step_000002/state.pt")):
            assert job.poll() is None, "the run ended before step 2's checkpoint:\n" + job.stdout.read()[-4000:]
            assert time.time() < deadline, "no checkpoint after 400 s"
            time.sleep(0.02)
        job.send_signal(signal.SIGKILL)
        job.wait(timeout=30)
    finally:
        if job.poll() is None:
            job.kill()
    (cut,) = [p for p in out.iterdir() if p.is_dir()]
    run_job(train_cmd(None, "--resume", str(cut)), tmp_path, timeout=400)
    a, b = _comparable(metrics(full)), _comparable(metrics(cut))
    assert [(r.get("phase"), r.get("step")) for r in a] == [(r.get("phase"), r.get("step")) for r in b]
    for ra, rb in zip(a, b):
        diff = {k: (ra.get(k), rb.get(k)) for k in ra.keys() | rb.keys() if ra.get(k) != rb.get(k)}
        assert not diff, f"step {ra.get('step')}: {sorted(diff.items())[:8]}"
