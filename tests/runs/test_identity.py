"""A resume that cannot lie (issue 47), on the checkpoint functions with tiny modules: manifests of
the wrong shape are damage (fallback, never a crash); a damaged checkpoint is replaced so that a
SIGKILL at each step of the replacement leaves one complete checkpoint; a checkpoint of another
run, or relabelled, is skipped with its reason; RL checkpoints fall back with the SFT checkpoint
they trained from; run-level files are written whole; a cut metrics record is measured."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from vagent.runs.checkpoint import (
    _VERIFIED, CheckpointError, check_checkpoint, list_checkpoints, load_checkpoint, save_checkpoint, select_checkpoint,
    trained_from,
)
from vagent.runs.identity import RunIdentity, read_run_identity
from vagent.runs.manifest import MANIFEST, remove_stale_temporaries
from vagent.runs.metrics import torn_last_record
from vagent.runs.rundir import write_atomic

CONFIG = {"model.tiny_hidden": 8, "seed": 0, "recipe": "ppo", "steps": 4}


def _run(root: Path, config: dict = CONFIG) -> tuple[Path, RunIdentity]:
    """A run directory with its run.json; returns (checkpoints dir, identity)."""
    root.mkdir(parents=True, exist_ok=True)
    identity = RunIdentity.new(config)
    write_atomic(root / "run.json", identity.to_json())
    return root / "checkpoints", identity


def _save(ckpts: Path, phase: str, step: int, seed: int = 0) -> Path:
    torch.manual_seed(seed + step)
    return save_checkpoint(ckpts, phase, step, {"policy": torch.nn.Linear(3, 3), "critic": torch.nn.Linear(3, 1)},
                           data_position={"rl_step": step}, keep_last=5)


def _quiet(_: str) -> None:
    pass


# ----------------------------------------------------------------------------------------------
# manifests of any shape
# ----------------------------------------------------------------------------------------------

def _deep(n: int) -> str:
    return '{"version": 1, "files": ' + "[" * n + "]" * n + "}"


WRONG_SHAPES = {
    "entry-is-int": lambda m: {**m, "files": {**m["files"], "policy.pt": 5}},
    "entry-is-null": lambda m: {**m, "files": {**m["files"], "policy.pt": None}},
    "entry-is-string": lambda m: {**m, "files": {**m["files"], "policy.pt": "abc"}},
    "files-is-list": lambda m: {**m, "files": list(m["files"])},
    "top-is-string": lambda m: "manifest",
    "top-is-null": lambda m: None,
    "size-is-string": lambda m: {**m, "files": {**m["files"], "policy.pt": {**m["files"]["policy.pt"], "size": "9"}}},
    "path-escapes": lambda m: {**m, "files": {**m["files"], "../step_000001/policy.pt": m["files"]["policy.pt"]}},
    "omits-policy.pt": lambda m: {**m, "files": {k: v for k, v in m["files"].items() if k != "policy.pt"}},
    "deep-nesting": lambda m: _deep(200_000),
}


@pytest.mark.parametrize("kind", list(WRONG_SHAPES))
def test_a_manifest_of_the_wrong_shape_is_damage_and_the_resume_falls_back(tmp_path, kind):
    ckpts, identity = _run(tmp_path)
    _save(ckpts, "rl", 1)
    _save(ckpts, "rl", 2)
    m = ckpts / "step_000002" / MANIFEST
    new = WRONG_SHAPES[kind](json.loads(m.read_text()))
    m.write_text(new if isinstance(new, str) and new.startswith("{") else json.dumps(new))
    said: list[str] = []
    chosen = select_checkpoint(ckpts, say=said.append, run=identity)
    assert chosen is not None and chosen.path.name == "step_000001"
    assert said[0].startswith(f"warning: checkpoint {ckpts / 'step_000002'} is damaged (")
    with pytest.raises(CheckpointError, match="step_000002 is damaged"):
        load_checkpoint(ckpts / "step_000002", {"policy": torch.nn.Linear(3, 3)})


def test_a_file_the_manifest_does_not_list_is_damage(tmp_path):
    ckpts, identity = _run(tmp_path)
    _save(ckpts, "rl", 1)
    torch.save({"weight": torch.zeros(1)}, ckpts / "step_000001" / "extra.pt")
    assert "extra.pt is not listed in manifest.json" in check_checkpoint(ckpts / "step_000001")


# ----------------------------------------------------------------------------------------------
# replacing a damaged checkpoint: SIGKILL at each step
# ----------------------------------------------------------------------------------------------

_KILLED_SAVE = textwrap.dedent("""
    import os, shutil, signal, sys
    import torch
    from vagent.runs.checkpoint import save_checkpoint

    ckpts, kill_at = sys.argv[1], int(sys.argv[2])
    calls = [0]
    real_replace, real_rmtree = os.replace, shutil.rmtree

    def tick(partial=None):
        calls[0] += 1
        if calls[0] == kill_at:
            if partial is not None:  # part of the old folder deleted, then killed
                os.unlink(os.path.join(partial, "policy.pt"))
            os.kill(os.getpid(), signal.SIGKILL)

    def replace(src, dst):
        if ".tmp-" in str(src) or ".old-" in str(dst):
            tick()
        real_replace(src, dst)

    def rmtree(path, *a, **k):
        if ".old-" in str(path):
            tick()
            tick(partial=str(path))
        real_rmtree(path, *a, **k)

    os.replace, shutil.rmtree = replace, rmtree
    torch.manual_seed(7)
    save_checkpoint(ckpts, "rl", 2, {"policy": torch.nn.Linear(3, 3), "critic": torch.nn.Linear(3, 1)},
                    data_position={"rl_step": 2}, keep_last=5)
    print("not killed", flush=True)
""")

# 1: before the damaged folder is moved aside; 2: after, before the new one is renamed in;
# 3: after it is renamed in, before the old one is removed; 4: the old one half removed
KILL_POINTS = [1, 2, 3, 4]


@pytest.mark.parametrize("kill_at", KILL_POINTS)
def test_sigkill_at_each_step_of_a_replacement_leaves_one_complete_checkpoint(tmp_path, kill_at):
    ckpts, identity = _run(tmp_path)
    _save(ckpts, "rl", 1)
    _save(ckpts, "rl", 2)
    policy = ckpts / "step_000002" / "policy.pt"
    policy.write_bytes(policy.read_bytes()[:-100])  # damaged: the resume reruns step 2 and replaces it
    r = subprocess.run([sys.executable, "-c", _KILLED_SAVE, str(ckpts), str(kill_at)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == -9, (r.returncode, r.stdout, r.stderr[-2000:])

    said: list[str] = []
    remove_stale_temporaries(ckpts, say=said.append)  # what the next resume does first
    assert sorted(p.name for p in ckpts.iterdir()) == ["step_000001", "step_000002"]
    assert check_checkpoint(ckpts / "step_000002") is None
    chosen = select_checkpoint(ckpts, say=said.append, run=identity)
    assert chosen is not None and chosen.path.name == "step_000002"
    torch.manual_seed(7)
    expected = torch.nn.Linear(3, 3).state_dict()  # the new copy's weights (the killed writer's)
    got = torch.load(ckpts / "step_000002" / "policy.pt", weights_only=True)
    assert all(torch.equal(expected[k], got[k]) for k in expected)


# ----------------------------------------------------------------------------------------------
# identity: another run's checkpoint, a relabelled one
# ----------------------------------------------------------------------------------------------

def test_a_checkpoint_of_another_run_is_skipped_with_its_reason(tmp_path):
    ckpts, identity = _run(tmp_path / "a")
    other, _ = _run(tmp_path / "b", {**CONFIG, "seed": 1})
    _save(ckpts, "rl", 1)
    _save(other, "rl", 2, seed=1)
    shutil.copytree(other / "step_000002", ckpts / "step_000002")
    said: list[str] = []
    chosen = select_checkpoint(ckpts, say=said.append, run=identity)
    assert chosen.path.name == "step_000001"
    assert "it belongs to another run (run id" in said[0]


def test_a_relabelled_checkpoint_is_skipped(tmp_path):
    ckpts, identity = _run(tmp_path)
    _save(ckpts, "rl", 1)
    _save(ckpts, "rl", 2)
    shutil.copytree(ckpts / "step_000002", ckpts / "step_000003")  # cp -a step_000002 step_000003
    said: list[str] = []
    assert select_checkpoint(ckpts, say=said.append, run=identity).path.name == "step_000002"
    assert "its state.pt holds rl step 2 but its folder is named step_000003" in said[0]


def test_a_relabelled_checkpoint_without_identity_is_skipped_by_its_state(tmp_path):
    ckpts = tmp_path / "checkpoints"  # outside a run directory: no identity.json
    _save(ckpts, "rl", 1)
    shutil.copytree(ckpts / "step_000001", ckpts / "step_000004")
    said: list[str] = []
    assert select_checkpoint(ckpts, say=said.append).path.name == "step_000001"
    assert "holds rl step 1 but its folder is named step_000004" in said[0]


# ----------------------------------------------------------------------------------------------
# SFT and RL checkpoints fall back together
# ----------------------------------------------------------------------------------------------

def test_rl_checkpoints_fall_back_with_the_sft_checkpoint_they_trained_from(tmp_path):
    ckpts, identity = _run(tmp_path)
    _save(ckpts, "sft", 1)
    _save(ckpts, "sft", 2)
    _save(ckpts, "rl", 1)
    _save(ckpts, "rl", 2)
    assert trained_from(ckpts / "step_000002") == ckpts / "sft_000002"
    assert select_checkpoint(ckpts, say=_quiet, run=identity).path.name == "step_000002"
    policy = ckpts / "sft_000002" / "policy.pt"
    data = bytearray(policy.read_bytes())
    data[len(data) // 2] ^= 0xFF
    policy.write_bytes(bytes(data))  # the KL reference damaged: RL must not take sft_000001 as its reference
    _VERIFIED.clear()  # a new process (the next --resume) verifies again
    said: list[str] = []
    chosen = select_checkpoint(ckpts, say=said.append, run=identity)
    assert (chosen.phase, chosen.step) == ("sft", 1)  # SFT step 2 runs again, then RL from step 0
    assert "it trained from sft_000002 (its KL reference), which is damaged" in said[0]


# ----------------------------------------------------------------------------------------------
# run-level files
# ----------------------------------------------------------------------------------------------

def test_write_atomic_keeps_the_old_content_when_the_write_fails(tmp_path):
    f = tmp_path / "config.yaml"
    write_atomic(f, "seed: 0\n")

    with pytest.raises(TypeError):
        write_atomic(f, 12345)  # type: ignore[arg-type]  # fails mid-write
    assert f.read_text() == "seed: 0\n" and [p.name for p in tmp_path.iterdir()] == ["config.yaml"]
    assert read_run_identity(tmp_path) is None


def test_torn_last_metrics_record_is_measured(tmp_path):
    f = tmp_path / "metrics.jsonl"
    f.write_text('{"phase": "rl", "step": 1}\n{"phase": "rl", "st')
    assert torn_last_record(f) == len('{"phase": "rl", "st')
    f.write_text('{"phase": "rl", "step": 1}\n')
    assert torn_last_record(f) == 0
