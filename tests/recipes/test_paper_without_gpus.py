"""A paper recipe (configs/paper/, written for 4 GPUs) on a machine without CUDA: a full run is
refused before any work, in one line naming ``--smoke``; ``device=cpu`` forces it (issue 56)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import vagent.recipes.scale as scale
from vagent.config import ConfigError
from vagent.runconfig import load_config
from tests.recipes.conftest import hf_metadata_dir

PAPER = Path(__file__).resolve().parents[2] / "configs" / "paper"



def test_no_cuda_refuses_a_full_run_naming_smoke_and_device_cpu_forces_it(tmp_path, monkeypatch):
    monkeypatch.setattr(scale, "_cuda_memory", lambda: None)  # this machine: no CUDA device
    model = hf_metadata_dir(tmp_path)
    cfg = load_config(PAPER / "sokoban_vagen_full.yaml", [f"model.path={model}"])
    said: list[str] = []
    with pytest.raises(ConfigError) as info:
        scale.preflight(cfg, 1, say=said.append)
    msg = str(info.value)
    assert "\n" not in msg and "--smoke" in msg and "device=cpu" in msg and "no CUDA device" in msg, msg
    assert said == []  # the refusal is all the user sees
    forced = load_config(PAPER / "sokoban_vagen_full.yaml", [f"model.path={model}", "device=cpu"])
    scale.preflight(forced, 1, say=said.append)
    assert any("runs on the CPU, as device=cpu asks" in s for s in said), said
    said.clear()
    scale.preflight(cfg, 4, gpu_bytes=80 * scale.GIB, say=said.append)  # a GPU machine: unchanged
    assert said == ["estimated memory per GPU: 45 of 80 GiB before activations."]


def test_vagent_train_refuses_before_any_work_in_one_line(tmp_path):
    """The command a user types, on a machine without CUDA (hidden here): exit 1, one line on
    stderr, nothing on stdout, no run directory; the model (metadata only, no weights) is never
    loaded."""
    out = tmp_path / "runs"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, "-m", "vagent", "train", "--config", str(PAPER / "sokoban_vagen_full.yaml"),
                           f"model.path={hf_metadata_dir(tmp_path)}", f"out_dir={out}"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: this recipe is written for 4 GPUs"), proc.stderr
    assert "--smoke" in lines[0] and "device=cpu" in lines[0]
    assert proc.stdout == "" and not out.exists()
