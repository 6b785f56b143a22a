"""Replies stopped by a weight push and continued on the new weights (``rollout.interrupt``).

Under ``rollout.interrupt`` an engine replica stops its running replies between two decode steps
as soon as a weight push waits for it (``HFEngine.interrupt``), returns each unfinished reply with
finish reason ``"interrupted"`` and the tokens sampled so far, lets the push land, and the caller
(:class:`~vagent.models.remote.RemoteEngine`) sends each such reply again as a continuation: the
prompt plus the tokens it has, asking for the tokens still allowed. The joined reply keeps every
token's own behaviour log-prob and the weights version that sampled it (``token_versions``), so
the decoupled loss weighs each token by the policy that really drew it. Its end (EOS, a stop
string, the length) is found again on the joined tokens, so a stop string that spans the seam
still ends the reply where it would have.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

from vagent.models.generation import INTERRUPTED, GenerationOutput, GenerationRequest, SamplingParams
from vagent.models.stops import cut_reply
from vagent.seeds import derive_seed


def continuation(request: GenerationRequest, partial: GenerationOutput) -> GenerationRequest:
    """``request`` extended by the tokens ``partial`` already has (same images, routing key); a
    seeded request draws its remaining tokens from a seed of their own (its seed and the tokens
    so far), not again from the start of its stream."""
    seed = None if request.seed is None else derive_seed(request.seed, "continued", len(partial.token_ids))
    return dataclasses.replace(request, input_ids=list(request.input_ids) + list(partial.token_ids), seed=seed)


def token_versions(out: GenerationOutput) -> list[int | None]:
    """The weights version of each of ``out``'s tokens."""
    return list(out.token_versions) if out.token_versions is not None else [out.weights_version] * len(out.token_ids)


def joined(head: GenerationOutput, tail: GenerationOutput, params: SamplingParams, eos_token_ids: Sequence[int],
           decode: Callable[[list[int]], str]) -> GenerationOutput:
    """``head`` (stopped by a push) followed by ``tail`` (its continuation), cut where the whole
    reply ends; ``weights_version`` is the first token's, ``token_versions`` each token's."""
    ids, lps = list(head.token_ids) + list(tail.token_ids), list(head.logprobs) + list(tail.logprobs)
    versions = token_versions(head) + token_versions(tail)
    n, reason = cut_reply(ids, eos_token_ids, decode, params.stop_strings)
    if n == len(ids) and tail.finish_reason == INTERRUPTED:
        reason = INTERRUPTED  # stopped again by the next push: continued once more
    ids, lps, versions = ids[:n], lps[:n], versions[:n]
    spans = None not in versions and len(set(versions)) > 1
    return GenerationOutput(ids, lps, reason, decode(ids), versions[0] if versions else head.weights_version,
                            [int(v) for v in versions if v is not None] if spans else None)


def continue_interrupted(generate: Callable[[Sequence[GenerationRequest], SamplingParams], list[GenerationOutput]],
                         requests: Sequence[GenerationRequest], params: SamplingParams,
                         outputs: Sequence[GenerationOutput], encoder: Any) -> list[GenerationOutput]:
    """``outputs`` with every reply a push stopped continued by ``generate`` (again and again, as
    long as pushes keep stopping it) until it ends as an uninterrupted reply would."""
    def decode(ids: list[int]) -> str:
        return encoder.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    out = list(outputs)
    while todo := [i for i, o in enumerate(out) if o.finish_reason == INTERRUPTED]:
        by_left: dict[int, list[int]] = {}  # tokens still allowed -> the replies with that many
        for i in todo:
            by_left.setdefault(params.max_new_tokens - len(out[i].token_ids), []).append(i)
        for left, idx in sorted(by_left.items()):
            more = generate([continuation(requests[i], out[i]) for i in idx],
                            dataclasses.replace(params, max_new_tokens=left))
            for i, tail in zip(idx, more):
                out[i] = joined(out[i], tail, params, encoder.eos_token_ids, decode)
    return out


__all__ = ["continuation", "continue_interrupted", "joined", "token_versions"]
