"""Mini-batches and the weights that make gradient accumulation exact.

Micro-batches have one home, :mod:`vagent.distributed.split`: :func:`~vagent.distributed.micro_batch_rows`
cuts a batch's rows, :func:`~vagent.distributed.rank_micro_batches` gives a rank its share (the
update loop's micro-batches), and :class:`~vagent.distributed.RowResults` hands the no-grad scoring
passes their micro-batches and reassembles the results (in a job: each rank scores its share of the
rows, every rank ends with the whole [B, L] tensors).
"""

from __future__ import annotations

import torch
from torch import Tensor

from vagent.rl.losses import AGG_MODES

__all__ = ["accumulation_weight", "mini_batches"]


def accumulation_weight(mb_mask: Tensor, total_mask: Tensor, agg: str) -> float:
    """Weight of a micro-batch's aggregated loss so that the weighted sum over micro-batches equals
    the loss aggregated over the whole mini-batch: token-mean -> its share of loss tokens;
    sequence means -> its share of non-empty rows."""
    if agg not in AGG_MODES:
        raise ValueError(f"loss aggregation must be one of {AGG_MODES}, got {agg!r} (update.loss_agg)")
    if agg == "token-mean":
        return float(mb_mask.sum()) / max(1.0, float(total_mask.sum()))
    return float((mb_mask.sum(-1) > 0).sum()) / max(1.0, float((total_mask.sum(-1) > 0).sum()))


def mini_batches(n_rows: int, n_mini: int, seed: int) -> list[list[int]]:
    """A shuffled split of ``range(n_rows)`` into ``n_mini`` near-equal parts (seeded generator)."""
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(n_rows, generator=g).tolist()
    n_mini = max(1, min(n_mini, n_rows))
    return [sorted(perm[i::n_mini]) for i in range(n_mini)]
