"""A training rollout in which every episode failed stops ``vagent train`` with exit 1 and one
``error:`` line that names the episodes' own error, never a traceback or a bare count (issue 56).

- every episode fails for a missing optional dependency: primitive_skill on ``backend=maniskill``
  without ManiSkill (.venv), a real ``vagent train`` process: the line is the dependency's;
- every episode fails for another reason (the policy's request): the line counts them and names
  the first one's error line.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vagent.rollout.batch import build_token_batch
from vagent.rollout.records import Episode

from .conftest import small_overrides

no_maniskill = pytest.mark.skipif(importlib.util.find_spec("mani_skill") is not None,
                                  reason="ManiSkill is installed here: its episodes would run")


def _train(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """The ``vagent train`` command of this environment (its console script), as a user runs it."""
    script = Path(sys.executable).with_name("vagent")
    cmd = [str(script)] if script.is_file() else [sys.executable, "-m", "vagent.cli"]
    return subprocess.run([*cmd, "train", "--quiet", *args], cwd=cwd, capture_output=True, text=True, timeout=600,
                          env=dict(os.environ))


@no_maniskill
def test_a_missing_optional_dependency_is_one_error_line(tmp_path, tiny_vlm):
    done = _train(*small_overrides(tmp_path, tiny_vlm, "steps=1", "envs.0.name=primitive_skill",
                                   "envs.0.config={render: vision, image_size: 64, backend: maniskill}"), cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, done.stderr
    assert errors[0].startswith("error: every episode of the rollout (2) failed for a missing optional dependency: "
                                "env: ImportError: backend='maniskill' needs ManiSkill 3"), errors[0]
    assert "pip install 'vagent[maniskill]'" in errors[0] and "No module named 'sapien'" in errors[0], errors[0]


def _failed(error: str) -> Episode:
    return Episode("line", {}, seed=0, group_id=0, traj_id=0, system_prompt="", error=error)


def test_other_failures_name_the_first_error_line():
    tb = "env: Traceback (most recent call last):\n  File \"x.py\", line 1, in f\n    g()\nKeyError: 'goal'\n"
    episodes = [_failed("policy: request failed: openai: 400 content policy\nbody ..."), _failed(tb)]
    with pytest.raises(ValueError) as info:
        build_token_batch(episodes, pad_token_id=0)
    assert str(info.value) == ("no trainable episodes: 2 with error, 0 without a turn, 2 in all; first error: "
                               "policy: request failed: openai: 400 content policy")
    imports = [_failed("env: Traceback (most recent call last):\nModuleNotFoundError: No module named 'gym'"), _failed(tb)]
    with pytest.raises(ValueError, match="no trainable episodes: 2 with error.*first error: env: ModuleNotFoundError"):
        build_token_batch(imports, pad_token_id=0)  # not every episode lacks it: not a missing dependency
