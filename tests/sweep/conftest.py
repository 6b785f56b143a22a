"""Shared pieces of the sweep tests: a tiny model (built once per session) and sweep files of
one-step tiny runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

# The smallest run that still validates, checkpoints and writes summary.json (as tests/recipes SMALL).
TINY_RUN = {
    "steps": 1, "sft.steps": 0, "val.every": 1, "threads": 1,
    "envs.0.n_train": 2, "envs.0.n_val": 2, "envs.0.config.image_size": 64,
    "rollout.max_turns": 2, "rollout.max_new_tokens": 12,
    "update.epochs": 1, "update.mini_batches": 1, "update.warmup_steps": 0, "ppo.critic_warmup_steps": 0,
    "log.tensorboard": False, "log.progress": False, "log.rollouts_every": 1, "log.checkpoint_every": 1,
    "log.plot_every": 0,
    "log.plots": False,
}


@pytest.fixture(scope="session")
def tiny_vlm(tmp_path_factory) -> Path:
    from vagent.models.tiny import build_tiny_vlm

    return build_tiny_vlm(tmp_path_factory.mktemp("models") / "tiny-vlm", hidden=64, layers=2, image_size=64)


def write_sweep(path: Path, model_dir: Path, **fields) -> Path:
    """A sweep file over the default preset with TINY_RUN overrides (``overrides`` in fields add to them)."""
    overrides = dict(TINY_RUN, **{"model.path": str(model_dir)}, **fields.pop("overrides", {}))
    path.write_text(yaml.safe_dump({"name": "t", "overrides": overrides, **fields}, sort_keys=False))
    return path


def sweep_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "vagent.cli", "sweep", *args]


def run_sweep_process(sweep_file: Path, out: Path, timeout: float = 1200) -> subprocess.CompletedProcess:
    """``vagent sweep FILE --out OUT --num-cpus 2 --quiet`` in a subprocess (its own Ray cluster)."""
    return subprocess.run(sweep_cmd(str(sweep_file), "--out", str(out), "--num-cpus", "2", "--quiet"),
                          capture_output=True, text=True, timeout=timeout, env=dict(os.environ))
