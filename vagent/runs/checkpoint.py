"""Checkpoints that resume a run exactly: weights, optimizers, schedulers, RNG states, position.

A checkpoint is a folder ``checkpoints/step_<step>`` (or ``sft_<step>`` during an SFT phase)::

    state.pt     {"phase", "step", "data_position", "rng", "optimizers", "schedulers", "extra"}
    <name>.pt    a state_dict per module (policy, critic, ...) - exact for resuming
    policy/      the policy saved with save_pretrained + its tokenizer files (for eval / inference)

It is written to a hidden temporary folder and renamed into place, so a process killed while
saving (SIGKILL included) leaves the previous checkpoints intact and never a half-written one.
After a save, all but the newest ``keep_last`` checkpoints OF THAT PHASE are deleted, so the end of
the SFT warm start (the policy RL started from) is never pruned by RL's checkpoints.

``step`` is the number of steps completed in ``phase``: resuming from it runs step ``step`` next.

A job of several ranks (torchrun) writes the sharded layout instead (:func:`_save_sharded`)::

    state.pt         as above (rank 0) with "world_size" and "format": "dcp", optimizers in dcp/
    dcp/             torch.distributed.checkpoint: every module's and optimizer's state, each
                     rank writing its shards (``.metadata`` + ``__<rank>_0.distcp``)
    rng_rank<r>.pt   rank r's RNG states
    policy/          the full policy (gathered; rank 0 writes it) for eval / from_pretrained

A sharded checkpoint resumes with any number of ranks, one included (DCP re-shards on load); a
one-process checkpoint resumes in one process.
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
    from vagent.distributed import world

    if world().distributed:
        return _save_sharded(Path(ckpt_dir), phase, step, modules, optimizers, schedulers, data_position,
                             extra, export, keep_last)
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
    _publish(tmp, final, d, phase, keep_last)
    return final


def _publish(tmp: Path, final: Path, d: Path, phase: str, keep_last: int) -> None:
    """Move a complete checkpoint folder into place atomically, then keep the newest ``keep_last``
    checkpoints of ``phase``."""
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(d)
    for old in [c for c in list_checkpoints(d) if c.phase == phase][:-keep_last]:
        shutil.rmtree(old.path, ignore_errors=True)


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
    from vagent.distributed import world

    p = Path(path)
    state = torch.load(p / "state.pt", weights_only=False, map_location="cpu")
    if (p / "dcp").is_dir():
        return _load_sharded(p, state, modules, optimizers, schedulers, restore_rng_state)
    if world().distributed:
        raise ValueError(f"checkpoint {p} was written by one process (no dcp/ folder); resume it with one "
                         f"process (vagent train --resume RUN_DIR without --nproc), or start the job anew.")
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


# ----------------------------------------------------------------------------------------------
# the sharded layout (several ranks): torch.distributed.checkpoint
# ----------------------------------------------------------------------------------------------


def _module_of(opt: torch.optim.Optimizer, modules: Mapping[str, torch.nn.Module]) -> torch.nn.Module:
    """The first module (in order) that holds ``opt``'s parameters (DCP keys optimizer state by
    the module's parameter names)."""
    first = opt.param_groups[0]["params"][0]
    for m in modules.values():
        if any(q is first for q in m.parameters()):
            return m
    raise KeyError("an optimizer's parameters belong to none of the checkpoint's modules")


def _sharded_state(modules: Mapping[str, torch.nn.Module], optimizers: Mapping[str, torch.optim.Optimizer]) -> dict:
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    from vagent.distributed import reshard_all

    for m in modules.values():  # the sharded parameters, which the optimizers hold
        reshard_all(m)
    out: dict[str, Any] = {f"model.{k}": get_model_state_dict(m) for k, m in modules.items()}
    out.update({f"optim.{k}": get_optimizer_state_dict(_module_of(o, modules), o) for k, o in optimizers.items()})
    return out


def _save_sharded(d: Path, phase: str, step: int, modules: Mapping[str, torch.nn.Module],
                  optimizers: Mapping[str, torch.optim.Optimizer], schedulers: Mapping[str, Any],
                  data_position: Any, extra: Mapping[str, Any] | None, export: Callable[[Path], None] | None,
                  keep_last: int) -> Path:
    """Every rank writes its shards into one temporary folder; rank 0 writes state.pt and renames
    it into place (the same atomicity as one process: a killed job leaves no half checkpoint)."""
    import torch.distributed.checkpoint as dcp

    from vagent.distributed import barrier, collective, world

    w = world()
    final = d / _folder_name(phase, step)
    tmp = d / f".tmp-{final.name}-dcp"
    if w.is_main:
        d.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
    barrier("checkpoint folder made")
    state_dicts = _sharded_state(modules, optimizers)
    collective("checkpoint save (dcp)", lambda: dcp.save(state_dicts, checkpoint_id=tmp / "dcp"))
    torch.save(capture_rng(), tmp / f"rng_rank{w.rank}.pt")
    if export is not None:
        export(tmp / "policy")  # gathers the full policy on every rank; rank 0 writes it
    barrier("checkpoint shards written")
    if w.is_main:
        state = {
            "phase": phase, "step": int(step), "data_position": data_position, "rng": capture_rng(),
            "optimizers": {}, "schedulers": {k: s.state_dict() for k, s in schedulers.items()},
            "extra": dict(extra or {}), "world_size": w.size, "format": "dcp",
        }
        torch.save(state, tmp / "state.pt")
        _publish(tmp, final, d, phase, keep_last)
    barrier("checkpoint in place")
    return final


def _load_sharded(p: Path, state: dict, modules: Mapping[str, torch.nn.Module],
                  optimizers: Mapping[str, torch.optim.Optimizer], schedulers: Mapping[str, Any],
                  restore_rng_state: bool) -> dict:
    """Load a sharded checkpoint with this job's world size (one process included): DCP reads
    each rank's part of every tensor, whatever the sharding it was written with."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    from vagent.distributed import collective, world

    state_dicts = _sharded_state(modules, optimizers)
    collective("checkpoint load (dcp)", lambda: dcp.load(state_dicts, checkpoint_id=p / "dcp"))
    for k, m in modules.items():
        set_model_state_dict(m, state_dicts[f"model.{k}"])
    for k, o in optimizers.items():
        set_optimizer_state_dict(_module_of(o, modules), o, state_dicts[f"optim.{k}"])
    for k, s in schedulers.items():
        if k in state["schedulers"]:
            s.load_state_dict(state["schedulers"][k])
    if restore_rng_state:
        rank_file = p / f"rng_rank{world().rank}.pt"
        restore_rng(torch.load(rank_file if rank_file.is_file() else p / "rng_rank0.pt", weights_only=False))
    return state
