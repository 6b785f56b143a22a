"""vLLM's generation stepped by hand, so that a waiting weight push can stop it (``rollout.interrupt``).

``VLLMEngine.generate`` with an ``interrupt`` callable runs :func:`generate_stepped` instead of
``LLM.generate``. It does what ``LLM.generate`` does, in the same order: ``LLM.enqueue`` renders
the prompts and adds the requests to vLLM's engine, and ``LLMEngine.step`` runs the scheduler
until no request is left (``LLM.wait_for_completion``'s loop), so the replies are the ones
``LLM.generate`` samples (same ids for the same seeds). Between two steps it asks ``interrupt()``;
when it answers True, every unfinished request is stopped where it is: its output so far (sampled
ids, their log-probs, the weights version that sampled them) is taken from vLLM's output processor
as vLLM builds it for a request aborted by a client (``RequestState.make_request_output`` with
finish reason ``abort``, what ``AsyncLLM`` hands its callers), and the request is aborted
(``LLMEngine.abort_request``): its KV blocks are freed before the push lands.

vLLM internals read (vLLM 0.32): ``LLMEngine.output_processor.request_states`` (internal request
id -> ``RequestState``: ``external_req_id``, ``make_request_output``). A vLLM without them fails
here with a message that names this module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Sequence

if TYPE_CHECKING:
    from vllm import LLM
    from vllm.outputs import CompletionOutput


def generate_stepped(llm: LLM, prompts: Sequence[dict], sampling: Sequence[Any], lora_request: Any,
                     interrupt: Callable[[], bool]) -> list[tuple[CompletionOutput, bool]]:
    """One ``(completion, stopped)`` per prompt, in order: vLLM's ``CompletionOutput`` and whether
    ``interrupt`` stopped it before it ended (then it holds the tokens sampled so far)."""
    engine = llm.llm_engine
    internal = llm.enqueue(list(prompts), list(sampling), lora_request=lora_request, use_tqdm=False)
    states = _request_states(engine)
    order = {states[rid].external_req_id: i for i, rid in enumerate(internal)}  # step outputs carry these
    done: dict[int, tuple[Any, bool]] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[order[out.request_id]] = (out.outputs[0], False)
        if len(done) < len(internal) and interrupt():
            stopped = [i for i in range(len(internal)) if i not in done]
            for i in stopped:  # the tokens so far, as vLLM reports a request its client aborted
                done[i] = (_partial(states[internal[i]]), True)
            engine.abort_request([internal[i] for i in stopped], internal=True)
            break
    missing = [i for i in range(len(internal)) if i not in done]
    if missing:
        raise RuntimeError(f"vLLM's engine ran out of requests without finishing requests {missing}")
    return [done[i] for i in range(len(internal))]


def _request_states(engine: Any) -> dict:
    states = getattr(getattr(engine, "output_processor", None), "request_states", None)
    if states is None:
        raise RuntimeError("this vLLM has no LLMEngine.output_processor.request_states, which rollout.interrupt "
                           "reads (vagent.models.vllm_stepping, written for vLLM 0.32): install vLLM 0.32 "
                           "(scripts/vllm-env) or drop rollout.interrupt")
    return states


def _partial(state: Any) -> CompletionOutput:
    """The ``CompletionOutput`` of a running request, as vLLM makes it when the request is aborted."""
    from vllm.v1.engine import FinishReason

    out = state.make_request_output([], None, FinishReason.ABORT, None)
    return out.outputs[0]


__all__ = ["generate_stepped"]
