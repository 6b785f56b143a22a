"""How token-level policies grow a :class:`Conversation`'s token segments (masks born with tokens).

A conversation's token sequence is the concatenation of its ``segments``. A token-level policy
(``HFPolicy``, ``TokenScriptedPolicy``) answers a conversation in three steps:

1. :func:`encode_pending`: every message in ``messages[n_encoded:]`` (system or user, never
   assistant) becomes ONE segment with ``sampled=False`` (loss mask 0): the system message via
   ``encoder.encode_system(text)``, a user message via ``encoder.encode_user(text, images)``
   (which ends with the assistant generation prompt). Image placeholder tokens travel in the same
   segment as their pixels, so no later cut can separate them (docs/algorithms.md reference bug 7).
2. generation (the policy's business) from the concatenated ids and pixels;
3. :func:`append_reply`: the pending segments, then ONE segment with exactly the sampled ids
   (``sampled=True``, their sampling-time log-probs), then -- only if generation did not end with
   an end-of-turn token -- ONE mask-0 segment ``encoder.assistant_end_ids()`` closing the
   assistant turn so the next user turn continues the chat template. Finally
   ``n_encoded = len(messages) + 1``: the assistant message the caller appends next (the rollout
   does, with the reply's text) is already encoded by the sampled segment.

So the segments a policy adds for one call are ``[pending..., sampled, (end)]``; the rollout
relies on this shape to map segments to turns (``vagent.rollout.loop``). The ids trained on are
the sampled ids themselves: nothing is decoded and re-encoded (docs/algorithms.md reference bug 6).

The closing ids come from ``ChatEncoder.close_assistant(sampled_ids)``: all of
``assistant_end_ids()`` (``<|im_end|>\\n``) after a stop string or the length limit, only the
rest (``\\n``) when the model sampled ``<|im_end|>`` itself (that token keeps mask 1: the model
must learn to end its turn).

Context limit: a policy with ``max_context_tokens`` answers ``Reply(finish_reason=
"context_limit")`` and appends NOTHING when ``context + max_new_tokens`` would exceed it; whole
messages are the unit, so an image's tokens are never cut from its pixels (docs/algorithms.md reference bug 7).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, Sequence, runtime_checkable

from vagent.rollout.policy import Conversation, Message, Policy, Segment

if TYPE_CHECKING:  # `import vagent.rollout` stays free of torch and transformers
    from torch import Tensor

    from vagent.models.processor import ChatEncoder, EncodedSegment


@runtime_checkable
class TokenPolicy(Policy, Protocol):
    """A policy that records token segments; it can also encode a message without generating.

    The rollout uses ``encode_message`` to encode a truncated episode's final observation (mask 0)
    for the critic's bootstrap value.
    """

    def encode_message(self, message: Message) -> Segment: ...


class EncoderMessages:
    """What the token policies built on a ``ChatEncoder`` share (``HFPolicy``,
    ``TokenScriptedPolicy``): the pad token and a message encoded without generating."""

    encoder: ChatEncoder

    @property
    def pad_token_id(self) -> int:
        return int(self.encoder.pad_token_id)

    def encode_message(self, message: Message) -> Segment:
        """A system or user message as a mask-0 segment (used for the final observation)."""
        return encode_message(self.encoder, message)


def _as_int_list(ids: Sequence[int] | Tensor) -> list[int]:
    """Token ids as ints, from a list or a [n] / [1, n] tensor."""
    if hasattr(ids, "tolist"):
        ids = ids.tolist()
    if ids and isinstance(ids[0], list):  # a [1, n] tensor
        if len(ids) != 1:
            raise ValueError(f"expected one sequence of token ids, got a batch of {len(ids)}")
        ids = ids[0]
    return [int(i) for i in ids]


def segment_from_encoded(encoded: EncodedSegment) -> Segment:
    """A mask-0 :class:`Segment` from an encoder's ``EncodedSegment`` (ids, pixels, grid, n_images)."""
    grid = getattr(encoded, "image_grid_thw", None)
    n_images = int(getattr(encoded, "n_images", 0) or 0)
    if grid is not None and int(grid.shape[0]) != n_images:
        raise ValueError(f"encoded segment says n_images={n_images} but image_grid_thw has {grid.shape[0]} rows")
    return Segment(
        input_ids=_as_int_list(encoded.input_ids),
        sampled=False,
        pixel_values=getattr(encoded, "pixel_values", None),
        image_grid_thw=grid,
        n_images=n_images,
    )


def encode_message(encoder: ChatEncoder, message: Message) -> Segment:
    """Encode one system or user message as a mask-0 segment (see the module docstring)."""
    if message.role == "system":
        if message.images:
            raise ValueError("a system message cannot carry images; put them in a user message")
        return segment_from_encoded(encoder.encode_system(message.text))
    if message.role == "user":
        return segment_from_encoded(encoder.encode_user(message.text, list(message.images)))
    raise ValueError(
        "cannot encode an assistant message: its tokens must be the ones the policy sampled "
        "(no decode/re-encode, docs/algorithms.md reference bug 6). Append assistant messages only after the "
        "policy's reply, which already recorded their tokens."
    )


def encode_pending(conv: Conversation, encoder: ChatEncoder) -> list[Segment]:
    """Segments for ``conv.messages[n_encoded:]`` (not appended yet). Validates the conversation."""
    if conv.n_encoded > len(conv.messages):
        raise ValueError(
            f"conversation has n_encoded={conv.n_encoded} but only {len(conv.messages)} messages: "
            "after a token-level reply the caller must append the assistant message (Message("
            "'assistant', reply.text)) before asking for the next reply"
        )
    pending = conv.messages[conv.n_encoded:]
    if not pending:
        raise ValueError("conversation has no new system/user message to answer")
    if pending[-1].role != "user":
        raise ValueError(f"the last message must be a user message, got {pending[-1].role!r}")
    return [encode_message(encoder, m) for m in pending]


def flat_ids(segments: Sequence[Segment]) -> list[int]:
    """All token ids of ``segments``, in order."""
    return [i for s in segments for i in s.input_ids]


def flat_pixels(segments: Sequence[Segment], pixels: bool = True) -> tuple[Tensor | None, Tensor | None]:
    """(pixel_values [P, D] | None, image_grid_thw [n_images, 3] | None) of ``segments``, in order;
    ``pixels=False``: the grids only (pixel_values None), for engines that take raw images (vLLM)."""
    import torch

    with_images = [s for s in segments if s.n_images]
    if not with_images:
        return None, None
    grids = torch.cat([_image_tensor(s.image_grid_thw, s, "image_grid_thw") for s in with_images], 0)
    if not pixels:
        return None, grids
    return torch.cat([_image_tensor(s.pixel_values, s, "pixel_values") for s in with_images], 0), grids


def _image_tensor(value: Tensor | None, seg: Segment, name: str) -> Tensor:
    """``value``, the ``name`` of ``seg``, which has images and so must have it."""
    if value is None:
        raise ValueError(f"a segment with {seg.n_images} image(s) has no {name}: segments with images must be "
                         "built by an encoder (segment_from_encoded), which keeps pixels and grids with their tokens")
    return value


def end_segment_ids(encoder: ChatEncoder, sampled_ids: Sequence[int]) -> list[int]:
    """Mask-0 ids that close the assistant turn after ``sampled_ids`` (``ChatEncoder.close_assistant``:
    ``<|im_end|>\\n`` after a stop string or the length limit, only ``\\n`` after a sampled ``<|im_end|>``)."""
    return _as_int_list(encoder.close_assistant(list(sampled_ids)))


def context_tokens(segments: Sequence[Segment], pending: Sequence[Segment]) -> int:
    """Tokens of the context a reply would be generated from."""
    return sum(len(s.input_ids) for s in segments) + sum(len(s.input_ids) for s in pending)


def exceeds_context(n_context: int, max_new_tokens: int, max_context_tokens: int | None) -> bool:
    """True when ``context + max_new_tokens > max_context_tokens`` (the sample could not fit)."""
    return max_context_tokens is not None and n_context + max_new_tokens > max_context_tokens


def append_reply(conv: Conversation, pending: list[Segment], sampled_ids: Sequence[int],
                 logprobs: Sequence[float], encoder: ChatEncoder) -> None:
    """Append ``[pending..., sampled, (end)]`` to ``conv`` and mark the reply as encoded."""
    if len(logprobs) != len(sampled_ids):
        raise ValueError(f"{len(sampled_ids)} sampled ids but {len(logprobs)} logprobs")
    if not sampled_ids:
        raise ValueError("a reply must have at least one sampled token (an empty turn has no turn end)")
    conv.segments.extend(pending)
    conv.segments.append(Segment([int(i) for i in sampled_ids], sampled=True,
                                 logprobs=[float(x) for x in logprobs]))
    end = end_segment_ids(encoder, sampled_ids)
    if end:
        conv.segments.append(Segment(end, sampled=False))
    conv.n_encoded = len(conv.messages) + 1


def context_copy(seg: Segment) -> Segment:
    """A mask-0 copy of ``seg`` (an earlier reply shown as context in a window-mode sample)."""
    return Segment(list(seg.input_ids), sampled=False, logprobs=None, pixel_values=seg.pixel_values,
                   image_grid_thw=seg.image_grid_thw, n_images=seg.n_images)


__all__ = [
    "TokenPolicy", "EncoderMessages", "segment_from_encoded", "encode_message", "encode_pending", "flat_ids",
    "flat_pixels", "end_segment_ids", "append_reply", "context_copy", "context_tokens", "exceeds_context",
]
