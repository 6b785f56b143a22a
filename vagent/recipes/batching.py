"""Mini-batches, per-row scoring passes, and the weights that make gradient accumulation exact.

Micro-batches have one home, :mod:`vagent.distributed.split`: :func:`~vagent.distributed.micro_batch_rows`
cuts a batch's rows, :func:`~vagent.distributed.rank_micro_batches` gives a rank its share (the
update loop's micro-batches). In a job of several ranks, :func:`per_row` with ``split`` scores each
rank's share of the rows and gathers the results, so every rank ends with the whole [B, L] tensor.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, TypeVar, cast

import torch
from torch import Tensor

from vagent.distributed import RowTensors, micro_batch_rows, per_row_split
from vagent.rl.losses import AGG_MODES
from vagent.rollout.batch import TokenBatch

__all__ = ["accumulation_weight", "mini_batches", "per_row"]

#: what a per-row pass returns: one [b, l, ...] tensor, or a tuple of them
R = TypeVar("R", bound=RowTensors)


@torch.no_grad()
def per_row(batch: TokenBatch, max_tokens: int, fn: Callable[[TokenBatch], R], *, split: bool) -> R:
    """Apply ``fn(micro_batch)`` over micro-batches and reassemble, zero-padded and float32: a
    [b, l, ...] result becomes [B, L, ...]; a tuple of them, a tuple of reassembled tensors.

    ``split`` (a job of several ranks, ``world().distributed``): each rank applies ``fn`` to its
    share of the rows and all get the whole result (``vagent.distributed.per_row_split``); False:
    this process applies it to every row (in a job too: the same result, every rank doing all)."""
    if split:
        return cast(R, per_row_split(batch, max_tokens, cast(Callable[[TokenBatch], RowTensors], fn)))
    outs: list[Tensor] = []
    single = False
    for rows in micro_batch_rows(batch, max_tokens):
        result = fn(batch.select(rows))
        single = isinstance(result, Tensor)
        vals: tuple[Tensor, ...] = (result,) if isinstance(result, Tensor) else tuple(result)
        if not outs:
            outs = [torch.zeros((*batch.input_ids.shape, *v.shape[2:]), dtype=torch.float32,
                                device=batch.input_ids.device) for v in vals]
        idx = torch.as_tensor(rows, device=outs[0].device)
        for out, part in zip(outs, vals):
            out[idx, : part.shape[1]] = part.float()
    return cast(R, outs[0] if single else tuple(outs))


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
