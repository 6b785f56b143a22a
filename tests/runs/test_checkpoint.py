"""Checkpoints: exact round trip of weights, optimizer, scheduler and RNG states; keep-last-N;
a half-written checkpoint is never picked up."""

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
