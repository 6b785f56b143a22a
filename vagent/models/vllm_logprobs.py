"""The log-prob a vLLM reply records, without the bias that keeps the image placeholders from
being sampled: vLLM's processed log-probs are of ``(logits + bias) / T``; ``HFEngine`` records
``log_softmax(logits / T)`` of the model's own logits (``VLLMEngine``'s module docstring)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from vllm.logprobs import FlatLogprobs

#: logit bias that keeps vLLM from sampling the image / video placeholder tokens (vLLM clamps biases to
#: [-100, 100]; HFEngine masks them with -inf)
SUPPRESS_BIAS = -100.0


def unsuppressed_logprob(logprob: float, suppressed: Sequence[float], temperature: float) -> float:
    """The sampled token's log-prob without the suppression bias, i.e. ``log_softmax(logits / T)`` of
    the model's own logits (what ``HFEngine`` records), from vLLM's processed log-probs, which include
    the bias: ``logprob`` of the sampled token and ``suppressed`` of each suppressed token (all under
    ``(logits + bias) / T``). With z the processed logits and z' the unbiased ones (z'_s = z_s - b/T
    for a suppressed s, z'_j = z_j otherwise)::

        LSE(z') - LSE(z) = log(1 - sum_s exp(lp_s) + sum_s exp(lp_s - b / T))
        lp'_i = lp_i - (LSE(z') - LSE(z))
    """
    shift = SUPPRESS_BIAS / temperature
    total = 1.0 - sum(math.exp(x) for x in suppressed) + sum(math.exp(x - shift) for x in suppressed)
    return logprob - math.log(total)


def unsuppressed_logprobs(flat: FlatLogprobs, n_ids: int, temperature: float) -> list[float]:
    """:func:`unsuppressed_logprob` of every position of a reply at once, from vLLM's
    ``FlatLogprobs`` of a request with ``logprob_token_ids`` = the ``n_ids`` suppressed ids: each
    position holds the sampled token's processed log-prob first, then the suppressed ids' (a
    suppressed id equal to the sampled token is left out of the sum, as there)."""
    import numpy as np

    if len(flat.start_indices) == 0:
        return []
    width = 1 + n_ids
    if len(flat.logprobs) != width * len(flat.start_indices):
        raise RuntimeError(f"vLLM returned {len(flat.logprobs)} log-probs for {len(flat.start_indices)} positions; "
                           f"expected {width} per position (the sampled token and {n_ids} suppressed ids)")
    lp = np.asarray(flat.logprobs, dtype=np.float64).reshape(-1, width)  # [positions, 1 + n_ids]
    ids = np.asarray(flat.token_ids, dtype=np.int64).reshape(-1, width)
    other = ids[:, 1:] != ids[:, :1]  # [positions, n_ids]: the suppressed ids that were not sampled
    sup = lp[:, 1:]
    shift = SUPPRESS_BIAS / temperature
    total = 1.0 - np.where(other, np.exp(sup), 0.0).sum(1) + np.where(other, np.exp(sup - shift), 0.0).sum(1)
    return (lp[:, 0] - np.log(total)).tolist()


__all__ = ["SUPPRESS_BIAS", "unsuppressed_logprob", "unsuppressed_logprobs"]
