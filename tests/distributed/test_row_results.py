"""RowResults, the loop of a no-grad scoring pass: in one process it equals a plain loop over the
micro-batches (tensors and tuples, float32, zero-padded); in a job of 2 ranks with unequal
micro-batch counts every rank runs as many forwards, drops the padding ones' results and holds
the one-process result exactly; misuse is an error that says what was expected."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import Tensor

from vagent.distributed import RowResults, micro_batch_rows, world
from vagent.rollout.batch import TokenBatch

#: real tokens of each row; with MAX_TOKENS 60 over 2 ranks: rank 0 gets rows 0, 3, 4 (2 micro-batches:
#: [0], [3, 4]), rank 1 rows 1, 2 (1 micro-batch, then a padding one of row 4, whose result would
#: overwrite rank 0's if it were kept: the last rank's results are written last)
LENGTHS = [40, 30, 30, 20, 10]
MAX_TOKENS = 60


def token_batch(lengths: list[int], seed: int = 0) -> TokenBatch:
    """A text-only TokenBatch with rows of ``lengths`` real tokens (right-padded with 0)."""
    g = torch.Generator().manual_seed(seed)
    B, L = len(lengths), max(lengths)
    ids = torch.zeros(B, L, dtype=torch.long)
    att = torch.zeros(B, L, dtype=torch.long)
    for b, n in enumerate(lengths):
        ids[b, :n] = torch.randint(1, 1000, (n,), generator=g)
        att[b, :n] = 1
    return TokenBatch(
        input_ids=ids, attention_mask=att, loss_mask=att.bool(), old_logprobs=torch.zeros(B, L),
        turn_end_mask=torch.zeros(B, L, dtype=torch.bool), token_rewards=torch.zeros(B, L),
        turn_index=torch.full((B, L), -1), bootstrap_index=torch.full((B,), -1),
        truncated=torch.zeros(B, dtype=torch.bool), episode_returns=torch.zeros(B), group_ids=torch.arange(B),
        traj_ids=torch.arange(B), row_turn=torch.full((B,), -1), pixel_values=None, image_grid_thw=None,
        state_keys=[[] for _ in range(B)], n_images=torch.zeros(B, dtype=torch.long), episode_index=torch.arange(B))


def forward(mb: TokenBatch) -> Tensor:
    """A stand-in for a model's per-token output [b, l], bfloat16 (so the float32 cast shows): a
    function of each row's own tokens and positions, 0 past its length."""
    pos = torch.arange(mb.input_ids.shape[1], dtype=torch.float32)
    return ((mb.input_ids.float() * 0.37 + pos + 1) * mb.attention_mask).to(torch.bfloat16)


def forward_pair(mb: TokenBatch) -> tuple[Tensor, Tensor]:
    """A two-output pass: ([b, l], features [b, l, 3])."""
    v = forward(mb)
    return v, torch.stack([v, -v, 2 * v], -1)


def plain_loop(batch: TokenBatch, max_tokens: int) -> tuple[Tensor, Tensor]:
    """The reference: forward_pair on each micro-batch, written into zeroed float32 [B, L, ...] outputs."""
    B, L = batch.input_ids.shape
    out, feats = torch.zeros(B, L), torch.zeros(B, L, 3)
    for rows in micro_batch_rows(batch, max_tokens):
        v, f = forward_pair(batch.select(rows))
        out[rows, : v.shape[1]] = v.float()
        feats[rows, : f.shape[1]] = f.float()
    return out, feats


def test_one_process_equals_a_plain_loop_for_tensors_and_tuples():
    batch = token_batch([30, 10, 20, 25, 5, 12])
    ref, ref_feats = plain_loop(batch, 40)
    assert len(micro_batch_rows(batch, 40)) > 2  # several micro-batches of unequal lengths
    for split in (False, True):  # split in a single process: the same micro-batches, no collective
        rows = RowResults[Tensor](batch, 40, split=split)
        n = 0
        for mb in rows:
            rows.put(forward(mb))
            n += 1
        out = rows.whole()
        assert n == len(micro_batch_rows(batch, 40))
        assert out.dtype == torch.float32 and out.shape == batch.input_ids.shape and torch.equal(out, ref)
        pairs = RowResults[tuple[Tensor, ...]](batch, 40, split=split)
        for mb in pairs:
            pairs.put(forward_pair(mb))
        got = pairs.whole()
        assert isinstance(got, tuple) and len(got) == 2
        assert torch.equal(got[0], ref) and torch.equal(got[1], ref_feats) and got[1].dtype == torch.float32
        assert torch.equal(rows.whole(), out)  # asked again: the same


def test_misuse_is_an_error_naming_what_was_expected():
    batch = token_batch([30, 10, 20, 25])
    rows = RowResults[Tensor](batch, 40, split=False)
    with pytest.raises(RuntimeError, match="put\\(\\) called before iterating"):
        rows.put(torch.zeros(1, 1))
    it = iter(rows)
    mb = next(it)
    with pytest.raises(RuntimeError, match="before whole\\(\\)"):  # micro-batch 0 not put yet
        rows.whole()
    rows.put(forward(mb))
    with pytest.raises(RuntimeError, match="twice for micro-batch 0"):
        rows.put(forward(mb))
    next(it)  # micro-batch 1 handed out, left without a result
    with pytest.raises(RuntimeError, match="micro-batch 1 of 3 has no result"):
        next(it)
    with pytest.raises(RuntimeError, match="iterated twice"):
        next(iter(rows))

    graph = RowResults[Tensor](batch, 40, split=False)
    w = torch.ones((), requires_grad=True)
    with pytest.raises(RuntimeError, match="torch.no_grad"):
        for mb in graph:
            graph.put(forward(mb).float() * w)
    with torch.no_grad():  # the same pass without autograd is accepted
        ok = RowResults[Tensor](batch, 40, split=False)
        for mb in ok:
            ok.put(forward(mb).float() * w)
    assert not ok.whole().requires_grad


JOB = """
import sys, torch
from vagent.distributed import Padding, RowResults, init_world, rank_micro_batches, shutdown_world
from tests.distributed.test_row_results import LENGTHS, MAX_TOKENS, forward, forward_pair, token_batch

w = init_world("cpu")
batch = token_batch(LENGTHS)
groups = rank_micro_batches(batch, MAX_TOKENS)  # this rank's share, then padding micro-batches
garbage = lambda mb: torch.full(mb.input_ids.shape, 1e9)  # a padding result: must never reach whole()
rows = RowResults[torch.Tensor](batch, MAX_TOKENS, split=True)
for i, mb in enumerate(rows):
    rows.put(garbage(mb) if isinstance(groups[i], Padding) else forward(mb))
pairs = RowResults[tuple](batch, MAX_TOKENS, split=True)
for i, mb in enumerate(pairs):
    pairs.put((garbage(mb), garbage(mb)[..., None].repeat(1, 1, 3)) if isinstance(groups[i], Padding)
              else forward_pair(mb))
torch.save({"one": rows.whole(), "pair": pairs.whole(), "forwards": len(groups),
            "padding": sum(isinstance(g, Padding) for g in groups)}, f"{sys.argv[1]}/rank{w.rank}.pt")
shutdown_world()
"""


@pytest.mark.timeout(180)
def test_a_job_of_two_ranks_holds_the_one_process_result(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(JOB)
    root = Path(__file__).parents[2]
    env = dict(os.environ, PYTHONPATH=str(root), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script),
           str(tmp_path)]
    done = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=170)
    assert done.returncode == 0, done.stderr[-3000:]
    assert not world().distributed
    ref, ref_feats = plain_loop(token_batch(LENGTHS), MAX_TOKENS)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    assert [r["forwards"] for r in ranks] == [2, 2] and [r["padding"] for r in ranks] == [0, 1]
    for r in ranks:  # every rank holds the whole result, exactly the one-process one
        assert r["one"].dtype == torch.float32 and torch.equal(r["one"], ref)
        assert isinstance(r["pair"], tuple) and torch.equal(r["pair"][0], ref) and torch.equal(r["pair"][1], ref_feats)
