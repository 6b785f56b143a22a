"""``vagent train --resume``: a run killed with SIGKILL and resumed logs exactly the metrics of an
uninterrupted run with the same seed (real subprocesses, real SIGKILL, tiny model on CPU)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from vagent.runs import read_metrics

from tests.waiting import wait_for_file

from .conftest import small_overrides

ARGS = ["steps=4", "sft.steps=2", "sft.demos_per_env=4", "sft.batch_size=2", "sft.actions_per_turn=1",
        "val.every=2", "log.checkpoint_every=1", "log.keep_last=2", "rollout.temperature=1.0"]


def _cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "vagent.cli", "train", "--quiet", *args]


def _run_dir(root: Path) -> Path:
    dirs = [p for p in (root / "runs").iterdir() if p.is_dir()]
    assert len(dirs) == 1, dirs
    return dirs[0]


def _comparable(run: Path) -> list[dict]:
    """Every record with timing fields removed (perf/*, time, val/time_s differ between runs)."""
    out = []
    for r in read_metrics(run / "metrics.jsonl"):
        out.append({k: v for k, v in r.items() if not k.startswith("perf/") and k not in ("time", "val/time_s")})
    return out


def test_sigkill_then_resume_equals_uninterrupted(tmp_path, tiny_vlm):
    env = dict(os.environ, PYTHONHASHSEED="random")  # hash() salting must not matter
    a_root, b_root = tmp_path / "a", tmp_path / "b"
    subprocess.run(_cmd(*small_overrides(a_root, tiny_vlm, *ARGS)), check=True, env=env, timeout=600)

    proc = subprocess.Popen(_cmd(*small_overrides(b_root, tiny_vlm, *ARGS)), env=env)
    wait_for_file(proc, b_root, "runs/*/checkpoints/step_000002/state.pt", "its second RL checkpoint", 600)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    run_b = _run_dir(b_root)
    assert not (run_b / "summary.json").exists()  # it really was killed mid-run

    subprocess.run(_cmd("--resume", str(run_b)), check=True, env=env, timeout=600)
    a, b = _comparable(_run_dir(a_root)), _comparable(run_b)
    assert [(r["phase"], r["step"]) for r in a] == [(r["phase"], r["step"]) for r in b]
    assert a == b
    assert "resuming from" in (run_b / "train.log").read_text()
