"""Training errors with messages that say what went wrong and what to change.

- :class:`NonFiniteError`: a loss, gradient norm or advantage became NaN/inf. The run stops
  before the bad update is applied and before any checkpoint is written, so the last checkpoint
  on disk is the last good state; the message names the quantity and the step.
- :func:`oom_message`: out of memory (``torch.OutOfMemoryError`` or a RuntimeError mentioning
  "out of memory"), with the knobs that reduce memory.
- :class:`ModelError`: a missing or incompatible model directory.
- :class:`DiskFullError`: out of disk space (``ENOSPC`` / ``EDQUOT`` anywhere in an exception's
  chain, as torch.save and safetensors wrap it): one line naming the path and the free space.
"""

from __future__ import annotations

import errno
import math
import shutil
from pathlib import Path
from typing import Any, Mapping


class TrainingError(RuntimeError):
    """A training run cannot continue; the message says why and how to fix it."""


class ModelError(TrainingError):
    """The model directory is missing or does not fit the run (e.g. text-only for a vision env)."""


class NonFiniteError(TrainingError):
    def __init__(self, quantity: str, value: float, phase: str, step: int, last_checkpoint: str | None):
        self.quantity, self.value, self.phase, self.step = quantity, value, phase, step
        kept = (f"The last good checkpoint is {last_checkpoint} (resume with --resume on the run dir)."
                if last_checkpoint else "No checkpoint was written yet.")
        super().__init__(
            f"{quantity} became {value} at {phase} step {step}; the run stopped before applying this "
            f"update. {kept} Likely causes: a learning rate too high for this model (lower "
            "update.actor_lr / ppo.critic_lr / sft.lr), no gradient clipping (update.grad_clip), or "
            "bad weights in the model directory."
        )


def first_non_finite(values: Mapping[str, Any]) -> tuple[str, float] | None:
    """(name, value) of the first entry that is (or contains) NaN/inf, else None."""
    for name, x in values.items():
        if x is None:
            continue
        if hasattr(x, "detach"):
            t = x.detach()
            if t.numel() and not bool(t.isfinite().all()):
                bad = t[~t.isfinite()].flatten()[0].item()
                return name, float(bad)
        elif not math.isfinite(float(x)):
            return name, float(x)
    return None


def check_finite(values: Mapping[str, Any], phase: str, step: int, last_checkpoint: str | None) -> None:
    """Raise :class:`NonFiniteError` for the first non-finite value in ``values``."""
    bad = first_non_finite(values)
    if bad is not None:
        raise NonFiniteError(bad[0], bad[1], phase, step, last_checkpoint)


def check_module_finite(module: Any, what: str, phase: str, step: int, last_checkpoint: str | None, *,
                        across_ranks: bool = True) -> None:
    """Raise :class:`NonFiniteError` naming the first parameter of ``module`` holding NaN/inf.

    One host sync for all parameters, and in a job one all-reduce of their flags, so that every
    rank stops at once and names the same parameter: each parameter's largest ``|x|`` on this
    rank's shard (NaN where it holds a NaN, inf where it holds an inf; a max cannot overflow),
    stacked into one vector (:func:`non_finite_flags`). ``across_ranks`` False: this rank's shards
    only, no collective, for a caller that only one rank may reach (an error handler). A
    ``bool(p.isfinite().all())`` per parameter waited for the device once each: ~830 times per
    update step of a 3B model, about a tenth of the step on an H200 (docs/results.md, "GPU
    check"), and once per collective each on sharded parameters."""
    from vagent.distributed import all_reduce_sum, world

    names, shards = [], []
    for name, p in module.named_parameters():
        t = p.detach()
        names.append(name)
        shards.append(t.to_local() if hasattr(t, "to_local") else t)  # FSDP2: this rank's shard
    bad = non_finite_flags(shards)
    if across_ranks and world().distributed:
        bad = [v > 0 for v in all_reduce_sum([float(b) for b in bad], "non-finite parameters")]
    if not any(bad):
        return
    i = bad.index(True)
    t = shards[i]
    hit = ~t.isfinite()
    value = float(t[hit].flatten()[0]) if t.numel() and bool(hit.any()) else float("nan")  # nan: on another rank
    raise NonFiniteError(f"{what} ({names[i]})", value, phase, step, last_checkpoint)


def non_finite_flags(tensors: list[Any]) -> list[bool]:
    """Whether each tensor holds a NaN or inf, with one host sync per (device, dtype) among them
    (one in a model): ``torch._foreach_norm(..., inf)``, one fused kernel per group on CUDA. Empty
    tensors (a rank's empty shard) are finite."""
    import torch

    flags = [False] * len(tensors)
    groups: dict[tuple, list[int]] = {}
    for i, t in enumerate(tensors):
        if t.numel():
            groups.setdefault((t.device, t.dtype), []).append(i)
    for idx in groups.values():
        peaks = torch.stack(torch._foreach_norm([tensors[i] for i in idx], math.inf))
        for i, b in zip(idx, (~torch.isfinite(peaks)).tolist()):
            flags[i] = b
    return flags


def is_oom(exc: BaseException) -> bool:
    import torch

    oom_cls = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", None)
    if oom_cls is not None and isinstance(exc, oom_cls):
        return True
    return isinstance(exc, (RuntimeError, MemoryError)) and (
        "out of memory" in str(exc).lower() or isinstance(exc, MemoryError))


def oom_message(where: str, cfg: Any) -> str:
    """The message for an out-of-memory error during ``where`` (rollout, update, sft)."""
    r, u, m = cfg.rollout, cfg.update, cfg.model
    tips = [
        f"update.micro_batch_tokens={u.micro_batch_tokens} (halve it; gradient accumulation keeps the batch)",
        f"rollout.group_size={r.group_size} or envs.N.n_train (fewer episodes per step)",
        f"rollout.max_new_tokens={r.max_new_tokens} / rollout.max_turns={r.max_turns} (shorter sequences)",
        f"model.gradient_checkpointing={str(m.gradient_checkpointing).lower()} (set true)",
        f"model.lora_rank={m.lora_rank} (e.g. 16: train adapters, not the whole model)",
        "rollout.window (keep only the last turns in the context)",
    ]
    return f"Out of memory during {where}. Reduce memory with one of:\n  - " + "\n  - ".join(tips)


class DiskFullError(TrainingError):
    """Out of disk space; the message names the path, the free space and how to go on."""

    def __init__(self, path: str | Path, what: str = "", resume: str | Path | None = None, free: str | None = None):
        self.path, self.what, self.free = str(path), what, free or free_space(path)
        then = (f"free some space there, then continue with: vagent train --resume {resume}" if resume
                else "free some space there and run again")
        super().__init__(f"out of disk space writing {what + ' ' if what else ''}{self.path} ({self.free}); "
                         f"earlier checkpoints are intact; {then}.")

    def resumable(self, resume: str | Path) -> "DiskFullError":
        """The same error, telling to resume run directory ``resume`` once space is freed."""
        return DiskFullError(self.path, self.what, resume, self.free)


_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_FULL_TEXTS = ("no space left on device", "disk quota exceeded")


def is_disk_full(exc: BaseException | None) -> bool:
    """Whether ``exc`` or an exception in its chain (``__cause__`` / ``__context__``) is a full
    disk: torch.save raises a RuntimeError whose context is the OSError, safetensors its own error
    with the OS message in its text."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, DiskFullError):
            return True
        if isinstance(exc, OSError) and exc.errno in _FULL_ERRNOS:
            return True
        if any(t in str(exc).lower() for t in _FULL_TEXTS):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def free_space(path: str | Path) -> str:
    """The free space of the filesystem holding ``path`` (its nearest existing parent), in words."""
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return f"{_human(shutil.disk_usage(p).free)} free"
    except OSError:
        return "free space unknown"


def _failed_path(exc: BaseException | None) -> str | None:
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.filename:
            return str(exc.filename)
        exc = exc.__cause__ or exc.__context__
    return None


def disk_full_error(where: str | Path, exc: BaseException | None = None, resume: str | Path | None = None,
                    what: str = "") -> DiskFullError:
    """The :class:`DiskFullError` for ``exc`` while writing under ``where`` (the file named in
    ``exc`` when it names one); ``resume`` is the run directory to resume once space is freed."""
    if isinstance(exc, DiskFullError):
        return exc.resumable(resume) if resume else exc
    return DiskFullError(_failed_path(exc) or where, what, resume)
