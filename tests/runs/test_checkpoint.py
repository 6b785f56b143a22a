"""Checkpoints: exact round trip of weights, optimizer, scheduler and RNG states (saved as tensors
and plain numbers; an older vagent's numpy RNG state still loads); keep-last-N; a half-written
checkpoint is never picked up."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from vagent.runs.checkpoint import list_checkpoints, load_checkpoint, save_checkpoint


def _setup(seed: int):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    return model, opt, sched


def _train(model, opt, sched, n: int) -> list[float]:
    losses = []
    for _ in range(n):
        x = torch.randn(16, 4)  # the global torch RNG drives the data
        loss = (model(x) - x.sum(1, keepdim=True) * random.random() * np.random.rand()).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
    return losses


def test_resume_continues_exactly(tmp_path):
    model, opt, sched = _setup(0)
    random.seed(1)
    np.random.seed(1)
    _train(model, opt, sched, 3)
    save_checkpoint(tmp_path, "rl", 3, {"policy": model}, {"actor": opt}, {"actor": sched}, data_position={"rl_step": 3})
    expected = _train(model, opt, sched, 4)

    model2, opt2, sched2 = _setup(123)  # different init and RNG: everything must come from the checkpoint
    random.seed(99)
    np.random.seed(99)
    ck = list_checkpoints(tmp_path)[-1]
    state = load_checkpoint(ck.path, {"policy": model2}, {"actor": opt2}, {"actor": sched2})
    assert (ck.phase, ck.step, state["data_position"]) == ("rl", 3, {"rl_step": 3})
    assert _train(model2, opt2, sched2, 4) == expected


def test_keep_last_and_ordering(tmp_path):
    model, opt, sched = _setup(0)
    for step in (1, 2):
        save_checkpoint(tmp_path, "sft", step, {"policy": model}, keep_last=2)
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, "rl", step, {"policy": model}, keep_last=2)
    found = [(c.phase, c.step) for c in list_checkpoints(tmp_path)]
    # SFT checkpoints come before every RL one; keep-last is per phase, so the warm start survives
    assert found == [("sft", 1), ("sft", 2), ("rl", 2), ("rl", 3)]


def test_partial_checkpoint_is_ignored(tmp_path):
    model, _, _ = _setup(0)
    save_checkpoint(tmp_path, "rl", 1, {"policy": model})
    # what a process killed while saving leaves behind: a temporary folder, and a folder without state.pt
    (tmp_path / ".tmp-step_000002-123").mkdir()
    (tmp_path / ".tmp-step_000002-123" / "policy.pt").write_bytes(b"partial")
    (tmp_path / "step_000003").mkdir()
    assert [(c.phase, c.step) for c in list_checkpoints(tmp_path)] == [("rl", 1)]


def test_missing_module_is_a_clear_error(tmp_path):
    model, _, _ = _setup(0)
    save_checkpoint(tmp_path, "rl", 1, {"policy": model})
    with pytest.raises(FileNotFoundError, match="no critic.pt"):
        load_checkpoint(list_checkpoints(tmp_path)[0].path, {"critic": model})


# ----------------------------------------------------------------------------------------------
# integrity: manifests, checkpoints without one, stale temporary folders (issue 35)
# ----------------------------------------------------------------------------------------------


def _two_checkpoints(tmp_path):
    model, opt, sched = _setup(0)
    for step in (1, 2):
        save_checkpoint(tmp_path, "rl", step, {"policy": model}, {"actor": opt}, {"actor": sched})
    return model, opt, sched


def test_manifest_lists_every_file_and_a_changed_byte_is_named(tmp_path):
    import json

    from vagent.runs.checkpoint import CheckpointError, check_checkpoint, select_checkpoint

    model, opt, sched = _two_checkpoints(tmp_path)
    files = json.loads((tmp_path / "step_000002" / "manifest.json").read_text())["files"]
    assert set(files) == {"policy.pt", "state.pt"} and not (tmp_path / "step_000002" / ".writer.lock").exists()
    f = tmp_path / "step_000002" / "policy.pt"
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0x10
    f.write_bytes(bytes(data))
    assert check_checkpoint(tmp_path / "step_000002").startswith("policy.pt does not match its manifest's SHA-256")
    said = []
    assert select_checkpoint(tmp_path, say=said.append).step == 1
    assert len(said) == 2 and "resuming from step_000001" in said[1]
    with pytest.raises(CheckpointError, match="step_000002 is damaged: policy.pt .*pass their checks: step_000001"):
        load_checkpoint(tmp_path / "step_000002", {"policy": model}, {"actor": opt}, {"actor": sched})


def _flip_tensor_byte(f) -> None:
    """Flip the first byte of the largest tensor's data in torch file ``f`` (a zip archive)."""
    import struct
    import zipfile

    with zipfile.ZipFile(f) as z:
        info = max(z.infolist(), key=lambda i: i.file_size if "/data/" in i.filename else -1)
    data = bytearray(f.read_bytes())
    name_len, extra_len = struct.unpack("<HH", data[info.header_offset + 26:info.header_offset + 30])
    data[info.header_offset + 30 + name_len + extra_len] ^= 0x10
    f.write_bytes(bytes(data))


def test_checkpoint_without_manifest_loads_unverified_after_crc_and_schema_checks(tmp_path):
    from vagent.runs.checkpoint import CheckpointError, check_checkpoint, select_checkpoint

    model, _, _ = _two_checkpoints(tmp_path)
    for step in (1, 2):  # as written by a vagent before manifests
        (tmp_path / f"step_00000{step}" / "manifest.json").unlink()
    said = []
    assert select_checkpoint(tmp_path, say=said.append).step == 2
    assert said == [f"warning: checkpoint {tmp_path / 'step_000002'} has no manifest (written by an older vagent): "
                    "resuming from it unverified (its .pt files pass their CRC check)"]
    _flip_tensor_byte(tmp_path / "step_000002" / "policy.pt")  # torch.load would read it without a word
    assert "fails its CRC-32 check" in check_checkpoint(tmp_path / "step_000002")
    torch.save({"weights": torch.zeros(2)}, tmp_path / "step_000001" / "state.pt")  # another schema
    assert check_checkpoint(tmp_path / "step_000001").startswith("state.pt is not a vagent checkpoint state")
    with pytest.raises(CheckpointError, match="no intact checkpoint in"):
        select_checkpoint(tmp_path, say=lambda _: None)
    with pytest.raises(CheckpointError, match="state.pt is not a vagent checkpoint state"):
        load_checkpoint(tmp_path / "step_000001", {"policy": model})


def test_stale_temporary_folders_without_a_lock_go_by_pid(tmp_path):
    import os
    import subprocess
    import sys

    from vagent.runs.manifest import remove_stale_temporaries

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    dead_pid = int(dead.stdout)
    for pid in (dead_pid, os.getpid(), os.getppid()):  # no .writer.lock: what an older vagent left
        (tmp_path / f".tmp-step_000003-{pid}").mkdir()
    (tmp_path / ".tmp-step_000003-dcp").mkdir()
    removed = remove_stale_temporaries(tmp_path)
    # dead, ours (not saving now) and a job's unlocked folder go; a live other process's stays
    assert sorted(p.name for p in removed) == sorted(
        [f".tmp-step_000003-{dead_pid}", f".tmp-step_000003-{os.getpid()}", ".tmp-step_000003-dcp"])
    assert (tmp_path / f".tmp-step_000003-{os.getppid()}").is_dir()
    model, _, _ = _setup(0)
    os.kill(os.getppid(), 0)  # the parent lives: even a save keeps its folder
    save_checkpoint(tmp_path, "rl", 4, {"policy": model})
    assert (tmp_path / f".tmp-step_000003-{os.getppid()}").is_dir()


def test_objects_saved_beside_the_modules_are_checksummed_and_read_back(tmp_path):
    from vagent.runs.checkpoint import CheckpointError, check_checkpoint, load_object

    model, opt, sched = _setup(0)
    record = {"step": 3, "episodes": [{"tokens": list(range(50))}]}
    ck = save_checkpoint(tmp_path, "rl", 3, {"policy": model}, {"actor": opt},
                         objects={"inflight": record, "none": None})
    assert (ck / "inflight.pt").is_file() and not (ck / "none.pt").exists()  # None: nothing saved
    assert load_object(ck, "inflight") == record and load_object(ck, "missing") is None
    data = bytearray((ck / "inflight.pt").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (ck / "inflight.pt").write_bytes(bytes(data))
    problem = check_checkpoint(ck)  # the manifest covers it: a flipped byte is named
    assert problem is not None and "inflight.pt" in problem
    with pytest.raises(CheckpointError, match="inflight.pt"):
        load_checkpoint(ck, {"policy": model})
    for name in ("policy", "state", "rng_rank0", "Bad-Name"):  # would overwrite the checkpoint's own files
        with pytest.raises(ValueError, match="checkpoint object name"):
            save_checkpoint(tmp_path, "rl", 4, {"policy": model}, objects={name: 1})
    assert [c.step for c in list_checkpoints(tmp_path)] == [3]


def test_rng_states_are_plain_data_and_an_older_numpy_state_still_loads(tmp_path):
    """state.pt names no global (the numpy RNG state is 624 ints, not an array: issue 55); an older
    vagent's state.pt, with numpy's own tuple, loads through the narrow numpy allowlist."""
    from vagent.runs.checkpoint import _VERIFIED, check_checkpoint
    from vagent.runs.manifest import write_manifest
    from vagent.runs.safe_load import data_problem

    model, _, _ = _setup(0)
    ck = save_checkpoint(tmp_path, "rl", 1, {"policy": model})
    assert data_problem(ck / "state.pt") is None
    state = torch.load(ck / "state.pt", weights_only=True)
    np.random.seed(5)
    state["rng"]["numpy"] = np.random.get_state()  # as an older vagent saved it: a tuple with a uint32 array
    expected = np.random.rand(3)
    torch.save(state, ck / "state.pt")
    (ck / "manifest.json").unlink()
    write_manifest(ck)
    _VERIFIED.clear()
    assert check_checkpoint(ck) is None
    np.random.seed(99)
    load_checkpoint(ck, {"policy": model})
    assert np.array_equal(np.random.rand(3), expected)
