"""``HFPolicy``: a local model (any ``vagent.models`` engine) as a token-level :class:`Policy`.

For a batch of conversations, :meth:`HFPolicy.act`

1. encodes each conversation's new messages (``messages[n_encoded:]``, system or user) into
   mask-0 segments with the model's ``ChatEncoder`` -- earlier assistant replies are already
   there as the segments the policy sampled;
2. builds one ``GenerationRequest`` per conversation from the concatenated ids and pixels of its
   segments (a conversation whose context plus ``max_new_tokens`` would exceed
   ``max_context_tokens`` gets ``Reply(finish_reason="context_limit")`` and is not generated);
3. calls the engine ONCE for the batch;
4. appends exactly the sampled ids as a ``Segment(sampled=True, logprobs=...)`` and the mask-0
   ids that close the assistant turn (see :mod:`vagent.rollout.encoding`).

The training sequence is therefore exactly the sampled ids: no decode/re-encode (docs/algorithms.md
bug 6); ``Reply.text`` (decoded, special tokens skipped) is only what the env reads.

Threads: ``act`` may run in many threads at once (the asynchronous rollout) when the engine is
thread-safe (``BatchingEngine``, ``RemoteEngine``: ``engine.thread_safe``); encoding and appending
are serialized by a lock, the engine call is not. Each request carries ``key =
Conversation.key`` (the trajectory) for replica routing, and each ``Reply`` the output's
``weights_version``.

A reply containing an image/video placeholder token (``<|image_pad|>``; a random-weight model
can sample it) cannot be trained on -- the forward would look for pixels for it -- so it becomes
``Reply(error=...)`` and the rollout marks the episode as an error (counted, excluded), never a
silent repair.

Sampling: ``SamplingConfig.temperature == 0`` is greedy; otherwise temperature / top-p / top-k
sampling seeded with ``SamplingConfig.seed`` (the engine forks the torch RNG, so the draws are
reproducible for the same batch and never touch the caller's RNG). With
``per_request_seeds=True`` each request gets its own seed, ``request_seed(SamplingConfig.seed,
Conversation.key)``, so a reply no longer depends on the batch it was sampled in: what engine
replicas and the asynchronous rollout need to reproduce the same tokens (the default keeps the
batch-seeded draws). ``stop`` strings end a reply
right after the string (the engine cuts the ids there); ``max_new_tokens`` is the per-turn budget.
``Reply.logprobs`` are the engine's: the log-softmax of logits / temperature (before top-k/top-p
truncation) of each sampled token; greedy replies use temperature 1. The RL recipes score with
the same temperature (``policy_forward(..., temperature=)``), so old and new log-probs agree.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from vagent.rollout.encoding import (
    EncoderMessages, append_reply, context_tokens, encode_pending, exceeds_context, flat_ids, flat_pixels,
)
from vagent.rollout.policy import Conversation, Reply, SamplingConfig, Segment

if TYPE_CHECKING:  # torch and transformers load on first use (HFPolicy's constructor)
    from vagent.models.engine import Engine, GenerationOutput, GenerationRequest, SamplingParams
    from vagent.models.loading import LoadedModel
    from vagent.models.processor import ChatEncoder


def sampling_params(sampling: SamplingConfig) -> SamplingParams:
    """``vagent.models.engine.SamplingParams`` for a :class:`SamplingConfig` (temperature 0 = greedy)."""
    from vagent.models.engine import SamplingParams

    greedy = sampling.temperature <= 0
    return SamplingParams(
        temperature=1.0 if greedy else float(sampling.temperature),
        top_p=float(sampling.top_p),
        top_k=int(sampling.top_k),
        max_new_tokens=int(sampling.max_new_tokens),
        stop_strings=tuple(sampling.stop),
        do_sample=not greedy,
        seed=None if greedy else int(sampling.seed),
    )


def request_seed(seed: int, key: int | None) -> int:
    """A request's own sampling seed from the turn's seed and the trajectory key (splitmix64 mix)."""
    x = (int(seed) * 0x9E3779B97F4A7C15 + (0 if key is None else int(key) + 1)) % 2**64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) % 2**64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) % 2**64
    return (x ^ (x >> 31)) % 2**63


class HFPolicy(EncoderMessages):
    """A local model as a token-level policy (see the module docstring).

    Args:
        model: a ``LoadedModel`` (from ``vagent.models.load_policy``; an ``HFEngine`` is built on
            it), or an engine (anything with ``generate(requests, params)`` and an ``encoder``).
        encoder: the ``ChatEncoder``; only needed when ``model`` is an engine without ``.encoder``.
        max_context_tokens: the most tokens one sample may hold (context + ``max_new_tokens``);
            None = unlimited. An episode that would exceed it is truncated before generating.
        prefix_cache: for a ``LoadedModel``: the ``HFEngine`` keeps its KV cache between turns and
            feeds only each turn's new tokens (see ``vagent.models.engine``).
        per_request_seeds: give every request its own seed (``request_seed``) instead of seeding
            the batch; needed for the same sampled tokens across replicas or with the async rollout.
        batching: for a ``LoadedModel``: put a ``BatchingEngine`` in front of the ``HFEngine``, so
            that ``act`` may be called from many threads (the asynchronous rollout).
    """

    def __init__(self, model: LoadedModel | Engine, encoder: ChatEncoder | None = None, *,
                 max_context_tokens: int | None = None,
                 prefix_cache: bool = True, per_request_seeds: bool = False, batching: bool = False):
        import torch

        if isinstance(model, torch.nn.Module):
            raise TypeError("HFPolicy takes a LoadedModel (vagent.models.load_policy) or an engine "
                            "(vagent.models.engine.HFEngine(model, encoder)), not a bare torch module")
        self.engine: Engine
        self.encoder: ChatEncoder
        if hasattr(model, "generate"):  # an engine
            self.engine = model
            found: ChatEncoder | None = encoder if encoder is not None else getattr(model, "encoder", None)
            if found is None:
                raise TypeError("HFPolicy(engine) needs the engine's ChatEncoder: pass encoder=")
            self.encoder = found
        elif hasattr(model, "model") and hasattr(model, "encoder"):  # a LoadedModel
            from vagent.models.engine import HFEngine

            self.encoder = encoder if encoder is not None else model.encoder
            self.engine = HFEngine(model.model, self.encoder, prefix_cache=prefix_cache)
            if batching:
                from vagent.models.batching import BatchingEngine

                self.engine = BatchingEngine(self.engine)
        else:
            raise TypeError(
                f"HFPolicy expects a LoadedModel (vagent.models.load_policy) or an engine with "
                f"generate(requests, params); got {type(model).__name__}"
            )
        if max_context_tokens is not None and max_context_tokens < 1:
            raise ValueError(f"max_context_tokens must be >= 1 or None, got {max_context_tokens}")
        self.max_context_tokens = max_context_tokens
        self.per_request_seeds = bool(per_request_seeds)
        self.needs_images = bool(getattr(self.engine, "needs_images", False))
        self._lock = threading.Lock()  # encoding / appending (act may run in several threads)
        vocab = self.encoder.tokenizer.get_vocab()
        #: ids the training forward treats as image/video slots; a reply must not contain them
        self.placeholder_ids = {i for i in (getattr(self.encoder, "image_token_id", None), vocab.get("<|video_pad|>"))
                                if i is not None}

    @classmethod
    def from_pretrained(cls, path: str | Path, *, max_context_tokens: int | None = None,
                        **load_kwargs: Any) -> "HFPolicy":
        """Load a model directory (``vagent.models.load_policy(path, **load_kwargs)``) as a policy."""
        from vagent.models.loading import load_policy

        return cls(load_policy(path, **load_kwargs), max_context_tokens=max_context_tokens)

    @property
    def thread_safe(self) -> bool:
        """Whether ``act`` may run in many threads at once (the engine merges or routes the calls)."""
        return bool(getattr(self.engine, "thread_safe", False))

    def act(self, conversations: Sequence[Conversation], sampling: SamplingConfig) -> list[Reply]:
        from vagent.models.engine import GenerationRequest

        with self._lock:
            pending = [encode_pending(conv, self.encoder) for conv in conversations]
        replies: list[Reply | None] = [None] * len(conversations)
        requests, rows = [], []
        greedy = sampling.temperature <= 0
        for i, (conv, new) in enumerate(zip(conversations, pending)):
            n_ctx = context_tokens(conv.segments, new)
            if exceeds_context(n_ctx, sampling.max_new_tokens, self.max_context_tokens):
                replies[i] = Reply("", finish_reason="context_limit", usage={"prompt_tokens": n_ctx, "completion_tokens": 0})
                continue
            segments = conv.segments + new
            seed = request_seed(sampling.seed, conv.key) if self.per_request_seeds and not greedy else None
            # engines that preprocess images themselves (vLLM) get the raw images, in prompt order, and
            # the grids (their count) but no pixels: the whole history's pixels are not concatenated
            # again at every turn for an engine that never reads them
            images = tuple(im for m in conv.messages for im in m.images) if self.needs_images else ()
            pixel_values, grid = flat_pixels(segments, pixels=not self.needs_images)
            requests.append(GenerationRequest(flat_ids(segments), pixel_values, grid, images=images, seed=seed,
                                              key=conv.key))
            rows.append(i)
        outputs = self.engine.generate(requests, sampling_params(sampling)) if requests else []
        if len(outputs) != len(requests):
            raise RuntimeError(f"engine returned {len(outputs)} outputs for {len(requests)} requests")
        for i, req, out in zip(rows, requests, outputs):
            replies[i] = self._reply(conversations[i], pending[i], req, out)
        return replies  # type: ignore[return-value]

    def _reply(self, conv: Conversation, pending: list[Segment], req: GenerationRequest,
               out: GenerationOutput) -> Reply:
        """The reply of one generated output, its segments appended to ``conv``; an error reply
        (nothing appended) when it holds an image/video placeholder token."""
        bad = [k for k, t in enumerate(out.token_ids) if t in self.placeholder_ids]
        if bad:  # untrainable: the forward would look for pixels for this token (fail loudly)
            return Reply(
                text=out.text, token_ids=list(out.token_ids), logprobs=list(out.logprobs), finish_reason="error",
                error=(f"sampled image/video placeholder token {out.token_ids[bad[0]]} at reply position "
                       f"{bad[0]}; a training forward would expect pixels for it (the engine should "
                       "suppress placeholder tokens)"),
            )
        with self._lock:
            append_reply(conv, pending, out.token_ids, out.logprobs, self.encoder)
        return Reply(
            text=out.text, token_ids=list(out.token_ids), logprobs=list(out.logprobs),
            finish_reason=out.finish_reason,
            usage={"prompt_tokens": len(req.input_ids), "completion_tokens": len(out.token_ids)},
            weights_version=getattr(out, "weights_version", None),
            token_versions=getattr(out, "token_versions", None),
        )


__all__ = ["HFPolicy", "sampling_params", "request_seed"]
