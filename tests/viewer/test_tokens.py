"""The token dump (vagent.runs.tokens) round-trips the token batch exactly, on its schedule and cap;
the viewer splits a row into turns by the loss mask alone."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from tests.viewer._run import PAD, CharTokenizer, FakeEncoder, episode
from vagent.rollout.batch import build_token_batch
from vagent.runs.rundir import due
from vagent.runs.tokens import _floats, read_token_rows, rows_as_tensors, save_token_rows, token_dump_path
from vagent.viewer.turns import split_row

LOG = SimpleNamespace(rollouts_every=2, rollouts_n=3, rollouts_max_mb=50.0)


@pytest.fixture(scope="module")
def batch_and_arrays():
    gen = torch.Generator().manual_seed(0)
    eps = [episode(s, s, 0, gen) for s in range(5)]
    eps[1].error = "backend failed"  # left out of the batch: its episode has no token rows
    batch = build_token_batch(eps, mode="concat", pad_token_id=PAD)
    M = batch.loss_mask
    arrays = {"logprobs": batch.old_logprobs - 1e-3 * torch.rand(M.shape, generator=gen) * M,
              "advantages": torch.randn(M.shape, generator=gen) * M, "values": torch.randn(M.shape, generator=gen) * M,
              "returns": torch.randn(M.shape, generator=gen)}  # returns also off the loss mask
    return batch, arrays


def test_dump_round_trips_the_token_batch_exactly(tmp_path, batch_and_arrays):
    batch, arrays = batch_and_arrays
    path = save_token_rows(tmp_path, 4, LOG, batch, FakeEncoder(CharTokenizer()), **arrays)
    assert path == token_dump_path(tmp_path, 4) and path.name == "step_000004.tokens.json"
    doc = read_token_rows(path)
    assert [r["episode"] for r in doc["rows"]] == [0, 2]  # rollouts_n=3, episode 1 errored
    rows = [r["row"] for r in doc["rows"]]
    want = batch.select(rows)
    got = rows_as_tensors(doc)
    assert torch.equal(got["input_ids"], want.input_ids)
    assert torch.equal(got["loss_mask"], want.loss_mask)
    assert torch.equal(got["turn_index"], want.turn_index)
    assert torch.equal(got["sample_logprobs"], want.old_logprobs)
    real = want.attention_mask.bool()  # padding is not written: it reads back as 0
    for name in ("logprobs", "advantages", "values", "returns"):  # bit-exact float32 on every real token
        expect = arrays[name].index_select(0, torch.tensor(rows))[:, :want.input_ids.shape[1]]
        assert torch.equal(got[name], torch.where(real, expect, torch.zeros_like(expect))), name
    assert doc["fields"] == ["logprobs", "advantages", "values", "returns"]
    assert doc["pieces"]["2"] == "<|im_end|>" and doc["image_token_id"] == 5
    assert [r["length"] for r in doc["rows"]] == want.lengths.tolist()


def test_dump_schedule_and_the_size_cap(tmp_path, batch_and_arrays):
    """The recipes dump at ``due(log.rollouts_every, step, last)``: every k steps and the last one,
    never with 0; past ``rollouts_max_mb`` the dump is a stub that names the setting."""
    assert [s for s in range(1, 8) if due(LOG.rollouts_every, s, 7)] == [2, 4, 6, 7]
    assert not any(due(0, s, 7) for s in range(1, 8))
    batch, arrays = batch_and_arrays
    enc = FakeEncoder(CharTokenizer())
    (tmp_path / "big.bin").write_bytes(b"x" * 30_000)
    capped = SimpleNamespace(rollouts_every=1, rollouts_n=3, rollouts_max_mb=0.02)
    stub = read_token_rows(save_token_rows(tmp_path, 5, capped, batch, enc, **arrays))
    assert "rows" not in stub and "rollouts_max_mb" in stub["skipped"]


def test_short_floats_read_back_bit_exact():
    x = np.concatenate([np.random.default_rng(0).standard_normal(20_000) * 10.0 ** np.arange(-20, 20).repeat(500),
                        [0.0, -0.0, 1.0, 3.4e38, 1.2e-38]]).astype(np.float32)
    back = np.array(json.loads(json.dumps(_floats(x))), dtype=np.float64).astype(np.float32)
    assert np.array_equal(back.view(np.uint32), x.view(np.uint32))
    assert _floats(np.array([np.nan, np.inf], dtype=np.float32)) == [None, None]


def test_split_row_by_loss_mask():
    # [sys sys | obs obs gen] [r0 r0 r0] [close | obs gen] [r1 r1] [close final]
    row = {"loss_mask": [0, 0, 0, 0, 0, 1, 1, 1, 0, 0, 0, 1, 1, 0, 0],
           "turn_index": [-1] * 5 + [0] * 3 + [-1] * 3 + [1] * 2 + [-1] * 2}
    spans, after = split_row(row)
    assert spans == {0: {"ctx": [0, 5], "reply": [5, 8]}, 1: {"ctx": [8, 11], "reply": [11, 13]}}
    assert after == [13, 15]


def test_dump_reads_only(tmp_path, batch_and_arrays):
    """The dump changes no tensor and draws no random number (torch, numpy, random)."""
    import random

    batch, arrays = batch_and_arrays
    before = {k: v.clone() for k, v in arrays.items()}
    ids, mask = batch.input_ids.clone(), batch.loss_mask.clone()
    states = (torch.get_rng_state(), np.random.get_state()[1].copy(), random.getstate())
    save_token_rows(tmp_path, 0, LOG, batch, FakeEncoder(CharTokenizer()), **arrays)
    assert torch.equal(torch.get_rng_state(), states[0]) and np.array_equal(np.random.get_state()[1], states[1])
    assert random.getstate() == states[2]
    assert all(torch.equal(arrays[k], before[k]) for k in arrays)
    assert torch.equal(batch.input_ids, ids) and torch.equal(batch.loss_mask, mask)
