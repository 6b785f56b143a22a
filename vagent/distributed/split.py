"""How a batch's rows are cut into micro-batches and shared between ranks (declared once here,
not at each call site).

Every rank holds the whole (global) batch -- rollout episodes are gathered before the batch is
built -- so advantages, whitening, filters and token means are the single-process ones. The work
on the rows (scoring passes, forward/backward of the update) is split: rank r takes the rows
:func:`split_rows` gives it, balanced by tokens, cuts them into micro-batches as one process would,
and every rank runs the SAME number of micro-batches (a rank with fewer runs zero-weight padding
ones) because each FSDP forward/backward is a collective: unequal counts hang both ranks. A no-grad
scoring pass loops over a :class:`RowResults`, which hands out the micro-batches and reassembles
their results (in a job: gathered, so that every rank holds the whole [B, L] tensors).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Generic, Iterator, TypeVar, cast

import torch
from torch import Tensor

from vagent.distributed.collectives import gather_objects, global_max
from vagent.distributed.world import world

if TYPE_CHECKING:  # vagent.distributed does not import the rollout package at run time
    from vagent.rollout.batch import TokenBatch

#: what a per-row pass gives for a micro-batch [b, l, ...], or for the batch [B, L, ...]: a tensor or a tuple
RowTensors = Tensor | tuple[Tensor, ...]
#: the kind of result of one RowResults: ``Tensor`` or ``tuple[Tensor, ...]``
R = TypeVar("R", bound=RowTensors)


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


class RowResults(Generic[R]):
    """A no-grad pass over a batch's micro-batches, reassembled: iterate it for the micro-batches,
    ``put`` each one's result, then ``whole()`` gives the batch's::

        rows = RowResults[Tensor](batch, max_tokens, split=world().distributed)
        for mb in rows:  # in a job: this rank's share of the rows, then padding micro-batches
            rows.put(forward(mb))  # [b, l, ...], or a tuple of them
        out = rows.whole()  # [B, L, ...] float32, zero-padded past each micro-batch's length

    ``split`` False: the micro-batches of every row (:func:`micro_batch_rows`; in a job too, every
    rank doing all). True: this rank's (:func:`rank_micro_batches`), whose padding ones run so that
    every rank joins every FSDP collective and whose results are dropped; ``whole()`` gathers the
    ranks' results so that every rank holds the whole. A tuple result stays a tuple of the same
    length. Results must carry no autograd graph (run the pass under ``torch.no_grad()``).
    """

    def __init__(self, batch: TokenBatch, max_tokens: int, *, split: bool) -> None:
        self.batch, self.split = batch, split
        self.groups = rank_micro_batches(batch, max_tokens) if split else micro_batch_rows(batch, max_tokens)
        self.iterated = False  # the loop over the micro-batches has begun
        self.current = -1  # index of the micro-batch handed out last (-1: none yet)
        self.n_put = 0  # micro-batches whose result was put
        self.single = False  # the results are single tensors (not tuples)
        self.outs: list[Tensor] = []  # the [B, L, ...] results, filled as they come (split: in whole())
        self.mine: list[tuple[list[int], list[Tensor]]] = []  # split: this rank's rows and results, on the CPU
        self.gathered = False  # split: whole() has gathered every rank's results into outs

    def __iter__(self) -> Iterator[TokenBatch]:
        if self.iterated:
            raise RuntimeError("RowResults was iterated twice: expected one loop over it; build a new RowResults "
                               "for each pass over a batch")
        self.iterated = True
        for i, rows in enumerate(self.groups):
            self.current = i
            yield self.batch.select(rows)
            self._expect_put(i)

    def put(self, result: R) -> None:
        """The result of the micro-batch just handed out: [b, l, ...] or a tuple of them."""
        if self.current < 0 or self.n_put > self.current:
            where = "before iterating" if self.current < 0 else f"twice for micro-batch {self.current}"
            raise RuntimeError(f"RowResults.put() called {where}: expected one put() per micro-batch, inside the "
                               "loop over the RowResults")
        self.n_put += 1
        self.single = isinstance(result, Tensor)
        vals = (result,) if isinstance(result, Tensor) else tuple(result)
        if any(v.requires_grad for v in vals):
            raise RuntimeError("RowResults.put() got a result with an autograd graph: expected a no-grad pass "
                               "(run the forward under torch.no_grad())")
        rows = self.groups[self.current]
        if not self.split:
            self._write(list(rows), [v.float() for v in vals])
        elif not isinstance(rows, Padding):  # a padding micro-batch's result is dropped
            self.mine.append((list(rows), [v.float().cpu() for v in vals]))

    def whole(self) -> R:
        """The [B, L, ...] float32 result (a tuple of them for tuple results); split: gathered from
        every rank (a collective: every rank calls it)."""
        self._expect_put(len(self.groups) - 1)
        if self.split and not self.gathered:
            for rows, vals in (p for rank_part in gather_objects(self.mine, "scoring results") for p in rank_part):
                self._write(rows, vals)
            self.mine, self.gathered = [], True
        if not self.outs:
            raise RuntimeError("RowResults.whole() has no result: expected a batch with at least one row")
        return cast(R, self.outs[0] if self.single else tuple(self.outs))

    def _expect_put(self, i: int) -> None:
        if self.n_put <= i:
            raise RuntimeError(f"RowResults: micro-batch {self.n_put} of {len(self.groups)} has no result: expected "
                               "put() for every micro-batch, inside the loop, before the next one and before whole()")

    def _write(self, rows: list[int], vals: list[Tensor]) -> None:
        """Copy the float32 results of micro-batch ``rows`` into the [B, L, ...] outputs (made on first use)."""
        device = self.batch.input_ids.device
        if not self.outs:
            self.outs = [torch.zeros((*self.batch.input_ids.shape, *v.shape[2:]), dtype=torch.float32, device=device)
                         for v in vals]
        idx = torch.as_tensor(rows, device=device)
        for out, v in zip(self.outs, vals):
            out[idx, : v.shape[1]] = v.to(device)
