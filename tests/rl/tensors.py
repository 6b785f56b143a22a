"""Helpers of the rl tests: a float tensor from a literal, and closeness at one tolerance."""

from __future__ import annotations

import torch


def T(x, dtype=torch.float32):
    return torch.tensor(x, dtype=dtype)


def close(a, b, tol=1e-5):
    """``a`` equals ``b`` within ``tol`` (absolute and relative), both compared as float32 tensors."""
    torch.testing.assert_close(torch.as_tensor(a).float(), torch.as_tensor(b).float(), atol=tol, rtol=tol)
