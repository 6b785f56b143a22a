"""How a batch's rows are cut into micro-batches and shared between ranks (declared once here,
not at each call site).

Every rank holds the whole (global) batch -- rollout episodes are gathered before the batch is
built -- so advantages, whitening, filters and token means are the single-process ones. The work
on the rows (scoring passes, forward/backward of the update) is split: rank r takes the rows
:func:`split_rows` gives it, balanced by tokens, cuts them into micro-batches as one process would,
and every rank runs the SAME number of micro-batches (a rank with fewer runs zero-weight padding
ones) because each FSDP forward/backward is a collective: unequal counts hang both ranks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import torch
from torch import Tensor

from vagent.distributed.collectives import gather_objects, global_max
from vagent.distributed.world import world

if TYPE_CHECKING:  # vagent.distributed does not import the rollout package at run time
    from vagent.rollout.batch import TokenBatch

#: what a per-row pass gives for a micro-batch [b, l, ...], or for the batch [B, L, ...]: a tensor or a tuple
RowTensors = Tensor | tuple[Tensor, ...]


class Padding(list):
    """The rows of a padding micro-batch: a real row run with loss weight 0 so that this rank
    joins the FSDP collectives of a micro-batch it has no rows for."""


def split_rows(lengths: list[int], n: int) -> list[list[int]]:
    """Rows 0..len-1 split into ``n`` parts with near-equal token totals: longest row first onto
    the part with the fewest tokens so far (ties: lowest part). Each part sorted."""
    parts: list[list[int]] = [[] for _ in range(n)]
    load = [0] * n
    for r in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        k = min(range(n), key=lambda j: (load[j], j))
        parts[k].append(r)
        load[k] += lengths[r]
    return [sorted(p) for p in parts]


def micro_batch_rows(batch: TokenBatch, max_tokens: int) -> list[list[int]]:
    """Row groups of ``batch`` with rows x longest row <= ``max_tokens`` (a longer row alone).

    Rows are taken longest first (ties: lowest index) and cut into consecutive groups, so that
    rows of similar length share a micro-batch and little compute goes to padding; accumulation
    makes the order irrelevant to the gradient. A row is never split.
    """
    lengths = batch.lengths.tolist()
    groups: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for r in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        if current and (len(current) + 1) * max(longest, lengths[r]) > max_tokens:
            groups.append(current)
            current, longest = [], 0
        current.append(r)
        longest = max(longest, lengths[r])
    if current:
        groups.append(current)
    return groups


def rank_micro_batches(batch: TokenBatch, max_tokens: int) -> list[list[int]]:
    """This rank's micro-batches of ``batch`` (row lists, indices into ``batch``).

    Single process: ``micro_batch_rows(batch, max_tokens)``, unchanged. In a job: micro-batches of
    this rank's share of rows, then :class:`Padding` ones up to the largest count of any rank.
    """
    w = world()
    if not w.distributed:
        return micro_batch_rows(batch, max_tokens)
    lengths = batch.lengths.tolist()
    mine = split_rows(lengths, w.size)[w.rank]
    groups: list[list[int]] = []
    if mine:
        groups = [[mine[i] for i in g] for g in micro_batch_rows(batch.select(mine), max_tokens)]
    n = global_max(len(groups), "micro-batch count")
    shortest = min(range(len(lengths)), key=lambda i: (lengths[i], i))
    return groups + [Padding([shortest]) for _ in range(n - len(groups))]


def per_row_split(batch: TokenBatch, max_tokens: int, fn: Callable[[TokenBatch], RowTensors]) -> RowTensors:
    """``per_row`` in a job: each rank applies ``fn`` to the micro-batches of its share of the rows
    (plus padding ones, whose results are dropped), then every rank assembles the whole result:
    a [b, l, ...] result becomes [B, L, ...] float32, zero-padded; a tuple, a tuple of them."""
    mine: list[tuple[list[int], list[Tensor]]] = []
    single = False
    for rows in rank_micro_batches(batch, max_tokens):
        vals = fn(batch.select(rows))
        single = isinstance(vals, Tensor)
        if isinstance(rows, Padding):
            continue
        vals = (vals,) if single else tuple(vals)
        mine.append((list(rows), [v.detach().float().cpu() for v in vals]))
    parts = [p for rank_part in gather_objects(mine, "per-row results") for p in rank_part]
    B, L = batch.input_ids.shape
    device = batch.input_ids.device
    outs = [torch.zeros((B, L, *v.shape[2:]), dtype=torch.float32, device=device) for v in parts[0][1]]
    for rows, vals in parts:
        idx = torch.as_tensor(rows, device=device)
        for out, v in zip(outs, vals):
            out[idx, : v.shape[1]] = v.to(device)
    return outs[0] if single else tuple(outs)
