"""The leaves every recipe shares: seeds, the optimizer, its schedule, gradient clipping, autocast.

A leaf module (:mod:`vagent.recipes.common` holds the env seeds, devices and model set-up, not
these), so that ``pretrain.py`` and ``sft.py`` use them without the rest of the recipes. Imports
only torch, :mod:`vagent.seeds` (``derive_seed``) and :mod:`vagent.distributed` (``clip_grads``).
"""

from __future__ import annotations

import contextlib
import math
from typing import Sequence

import torch

from vagent.distributed import reduce_replicated_grads
from vagent.seeds import derive_seed  # re-exported: the recipes' seeds come from here

def make_optimizer(params: Sequence[torch.nn.Parameter], lr: float, weight_decay: float) -> torch.optim.AdamW:
    params = [p for p in params if p.requires_grad]
    if not params:
        raise ValueError("no trainable parameters (is everything frozen?)")
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, betas=(0.9, 0.999), eps=1e-8)


def lr_factor(step: int, warmup: int, total: int, kind: str) -> float:
    """Multiplier of the base lr at scheduler step ``step`` (0-based).

    Linear warm-up from 1/(warmup+1) to 1 over ``warmup`` steps, then constant, linear decay to 0
    at ``total`` or cosine decay to 0 at ``total``.
    """
    if step < warmup:
        return (step + 1) / (warmup + 1)
    if kind == "constant" or total <= warmup:
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    if kind == "linear":
        return 1.0 - progress
    if kind == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"lr_schedule must be constant, linear or cosine, got {kind!r}")


def make_scheduler(opt: torch.optim.Optimizer, warmup: int, total: int, kind: str):
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, warmup, total, kind))


def clip_grads(params: Sequence[torch.nn.Parameter], max_norm: float) -> float:
    """Clip to ``max_norm`` (0 = measure only); returns the norm before clipping. In a job, the
    gradients of parameters that are not sharded are first summed over ranks, and the norm is the
    norm of the whole (global) gradient."""
    params = [p for p in params if p.grad is not None]
    if not params:
        return 0.0
    reduce_replicated_grads(params)
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm > 0 else float("inf"))
    return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)


def autocast(device: torch.device, enabled: bool):
    """bf16 autocast on ``device`` when ``enabled``, else a no-op context."""
    if not enabled:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


__all__ = ["derive_seed", "make_optimizer", "lr_factor", "make_scheduler", "clip_grads", "autocast"]
