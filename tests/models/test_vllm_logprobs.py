"""The placeholder log-prob correction of ``VLLMEngine`` without vLLM: the vectorised
``unsuppressed_logprobs`` over vLLM's flat log-prob layout equals the per-token
``unsuppressed_logprob`` (the hand-derived formula's implementation), and both give the
model's own log-softmax(z / T) from the biased one (run in the main .venv)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from vagent.models.vllm_logprobs import SUPPRESS_BIAS, unsuppressed_logprob, unsuppressed_logprobs

SUPPRESSED = (5, 6)


def biased_flat(logits: torch.Tensor, sampled: list[int], temperature: float) -> SimpleNamespace:
    """vLLM's ``FlatLogprobs`` of a request with ``logprob_token_ids=SUPPRESSED``: per position the
    sampled token's processed log-prob (bias on the placeholders, / T), then the placeholders'."""
    z = logits.double().clone()
    z[:, list(SUPPRESSED)] += SUPPRESS_BIAS
    lp = torch.log_softmax(z / temperature, -1)
    ids, lps, starts = [], [], []
    for row, t in zip(lp, sampled):
        starts.append(len(ids))
        for tok in (t, *SUPPRESSED):
            ids.append(tok)
            lps.append(float(row[tok]))
    return SimpleNamespace(token_ids=ids, logprobs=lps, start_indices=starts)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_vectorised_correction_equals_the_per_token_one_and_the_models_logprobs(temperature):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 12, generator=g) * 2
    logits[:, list(SUPPRESSED)] += 3.0  # the placeholders hold real mass: the correction matters
    sampled = [0, 3, 5, 7, 11, 2]  # position 2 sampled a placeholder (left out of its own sum)
    flat = biased_flat(logits, sampled, temperature)
    got = unsuppressed_logprobs(flat, len(SUPPRESSED), temperature)
    per_token = []
    for i, t in enumerate(sampled):
        row = flat.logprobs[3 * i: 3 * i + 3]
        per_token.append(unsuppressed_logprob(row[0], [x for s, x in zip(SUPPRESSED, row[1:]) if s != t], temperature))
    assert got == pytest.approx(per_token, abs=1e-12)
    own = torch.log_softmax(logits.double() / temperature, -1)
    want = [float(own[i, t]) for i, t in enumerate(sampled) if t not in SUPPRESSED]
    assert [x for x, t in zip(got, sampled) if t not in SUPPRESSED] == pytest.approx(want, abs=1e-9)
    biased = flat.logprobs[::3]
    assert max(abs(a - b) for a, b in zip(biased, got)) > 0.1  # precondition: not the identity here


def test_a_reply_without_positions_and_a_wrong_layout():
    assert unsuppressed_logprobs(SimpleNamespace(token_ids=[], logprobs=[], start_indices=[]), 2, 1.0) == []
    with pytest.raises(RuntimeError, match="expected 3 per position"):
        unsuppressed_logprobs(SimpleNamespace(token_ids=[1, 5, 6, 2], logprobs=[-1.0, -2.0, -3.0, -4.0],
                                              start_indices=[0, 3]), 2, 1.0)
