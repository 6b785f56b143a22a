"""Checkpoints that resume a run exactly: weights, optimizers, schedulers, RNG states, position.

A checkpoint is a folder ``checkpoints/step_XXXXXX`` (or ``sft_XXXXXX`` during an SFT phase)::

    state.pt     {"phase", "step", "data_position", "rng", "optimizers", "schedulers", "extra"}
    <name>.pt    a state_dict per module (policy, critic, ...) - exact for resuming
    policy/      the policy saved with save_pretrained + its tokenizer files (for eval / inference)

It is written to a hidden temporary folder and renamed into place, so a process killed while
saving (SIGKILL included) leaves the previous checkpoints intact and never a half-written one.
After a save, all but the newest ``keep_last`` checkpoints OF THAT PHASE are deleted, so the end of
the SFT warm start (the policy RL started from) is never pruned by RL's checkpoints.

``step`` is the number of steps completed in ``phase``: resuming from it runs step ``step`` next.
"""

from __future__ import annotations

import os
import random
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np
import torch

PHASES = ("sft", "rl")
_NAME = re.compile(r"^(sft|step)_(\d{6,})$")


def capture_rng() -> dict:
    """The RNG states of python, numpy and torch (CPU and every CUDA device)."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: Mapping[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


@dataclass(frozen=True)
class CheckpointInfo:
    path: Path
    phase: str
    step: int

    @property
    def order(self) -> tuple[int, int]:
        return (PHASES.index(self.phase), self.step)


def _folder_name(phase: str, step: int) -> str:
    if phase not in PHASES:
        raise ValueError(f"checkpoint phase must be one of {PHASES}, got {phase!r}")
    return f"{'sft' if phase == 'sft' else 'step'}_{step:06d}"


def list_checkpoints(ckpt_dir: str | Path) -> list[CheckpointInfo]:
    """Complete checkpoints in ``ckpt_dir``, oldest first (temporary folders are ignored)."""
    d = Path(ckpt_dir)
    if not d.is_dir():
        return []
    out = []
    for p in d.iterdir():
        m = _NAME.match(p.name)
        if m and (p / "state.pt").is_file():
            out.append(CheckpointInfo(p, "sft" if m.group(1) == "sft" else "rl", int(m.group(2))))
    return sorted(out, key=lambda c: c.order)


def save_checkpoint(
    ckpt_dir: str | Path,
    phase: str,
    step: int,
    modules: Mapping[str, torch.nn.Module],
    optimizers: Mapping[str, torch.optim.Optimizer] = {},
    schedulers: Mapping[str, Any] = {},
    data_position: Any = None,
    extra: Mapping[str, Any] | None = None,
    export: Callable[[Path], None] | None = None,
    keep_last: int = 2,
) -> Path:
    """Write a checkpoint atomically and prune old ones; returns its folder."""
    d = Path(ckpt_dir)
    d.mkdir(parents=True, exist_ok=True)
    final = d / _folder_name(phase, step)
    tmp = d / f".tmp-{final.name}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    for name, module in modules.items():
        torch.save(module.state_dict(), tmp / f"{name}.pt")
    state = {
        "phase": phase,
        "step": int(step),
        "data_position": data_position,
        "rng": capture_rng(),
        "optimizers": {k: o.state_dict() for k, o in optimizers.items()},
        "schedulers": {k: s.state_dict() for k, s in schedulers.items()},
        "extra": dict(extra or {}),
    }
    if export is not None:
        export(tmp / "policy")
    torch.save(state, tmp / "state.pt")
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(d)
    for old in [c for c in list_checkpoints(d) if c.phase == phase][:-keep_last]:
        shutil.rmtree(old.path, ignore_errors=True)
    return final


def _fsync_dir(d: Path) -> None:
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def load_checkpoint(
    path: str | Path,
    modules: Mapping[str, torch.nn.Module],
    optimizers: Mapping[str, torch.optim.Optimizer] = {},
    schedulers: Mapping[str, Any] = {},
    restore_rng_state: bool = True,
) -> dict:
    """Load weights/optimizers/schedulers in place, restore RNG states; returns the state dict."""
    p = Path(path)
    state = torch.load(p / "state.pt", weights_only=False, map_location="cpu")
    for name, module in modules.items():
        f = p / f"{name}.pt"
        if not f.is_file():
            raise FileNotFoundError(f"checkpoint {p} has no {name}.pt; it was written by a different recipe?")
        module.load_state_dict(torch.load(f, map_location="cpu", weights_only=True))
    for name, opt in optimizers.items():
        if name not in state["optimizers"]:
            raise KeyError(f"checkpoint {p} has no optimizer '{name}' (has {list(state['optimizers'])}).")
        opt.load_state_dict(state["optimizers"][name])
    for name, sched in schedulers.items():
        if name in state["schedulers"]:
            sched.load_state_dict(state["schedulers"][name])
    if restore_rng_state:
        restore_rng(state["rng"])
    return state
