"""The RNG states a checkpoint keeps: python's, numpy's and torch's (CPU and every CUDA device),
saved as tensors and plain data so that reading them back runs no code (vagent.runs.safe_load)."""

from __future__ import annotations

import random
from typing import Any, Mapping

import numpy as np
import torch

__all__ = ["capture_rng", "restore_rng"]


def capture_rng() -> dict:
    """The RNG states of python, numpy and torch (CPU and every CUDA device), as tensors and plain
    numbers (numpy's Mersenne Twister as ``{"kind", "key": 624 ints, "pos", "has_gauss",
    "cached_gaussian"}``), so that reading them back needs no global (vagent.runs.safe_load)."""
    kind, key, pos, has_gauss, cached = np.random.get_state(legacy=True)
    numpy_state = {"kind": str(kind), "key": [int(k) for k in key], "pos": int(pos), "has_gauss": int(has_gauss),
                   "cached_gaussian": float(cached)}
    state = {"python": random.getstate(), "numpy": numpy_state, "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: Mapping[str, Any]) -> None:
    """Set the RNG states :func:`capture_rng` returned (or an older vagent's, whose numpy state is
    numpy's own tuple)."""
    random.setstate(state["python"])
    saved = state["numpy"]
    if isinstance(saved, Mapping):
        saved = (saved["kind"], np.asarray(saved["key"], dtype=np.uint32), saved["pos"], saved["has_gauss"],
                 saved["cached_gaussian"])
    np.random.set_state(saved)
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
