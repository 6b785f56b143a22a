"""The Policy protocol: anything that answers conversations (local HF model, API model, script).

The rollout builds one :class:`Conversation` per training sample (the whole trajectory in
``concat`` mode, system prompt + current observation in ``no_concat`` mode) and asks the policy
for the next assistant reply of many conversations at once. Token-level policies (local models)
also record, on the conversation, the exact token ids they encoded and sampled, each with its
loss mask (1 if and only if the policy sampled the token), so training never decodes and
re-encodes (docs/algorithms.md reference bug 6). API policies leave ``segments`` empty.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol, Sequence, runtime_checkable

from PIL import Image

if TYPE_CHECKING:  # token-level policies make the tensors; text-level ones never import torch
    from torch import Tensor


@dataclass(frozen=True)
class Message:
    """One chat message; ``text`` has one ``<image>`` placeholder per image, in order."""

    role: Literal["system", "user", "assistant"]
    text: str
    images: tuple[Image.Image, ...] = ()


@dataclass
class Segment:
    """A run of token ids appended to a conversation's token sequence, with its loss mask.

    ``sampled`` is True only for tokens the policy sampled (loss mask 1); ``logprobs`` holds the
    sampling-time log-prob of each sampled token. ``pixel_values`` / ``image_grid_thw`` carry the
    pixels of the images whose placeholder tokens are in ``input_ids`` (never split from them).
    """

    input_ids: list[int]
    sampled: bool
    logprobs: list[float] | None = None
    pixel_values: Tensor | None = None  # [n_patches, patch_dim]
    image_grid_thw: Tensor | None = None  # [n_images, 3]
    n_images: int = 0


@dataclass
class Conversation:
    """The context of one sample: its messages and (for local models) its token segments.

    ``n_encoded`` counts the messages already turned into segments; a token-level policy encodes
    ``messages[n_encoded:]`` before generating, then appends its sampled segment.
    """

    messages: list[Message] = field(default_factory=list)
    segments: list[Segment] = field(default_factory=list)
    n_encoded: int = 0
    #: the trajectory this sample belongs to (the rollout sets ``Episode.traj_id``): engines with
    #: replicas route a trajectory's turns to one replica; per-request seeds derive from it
    key: int | None = None


@dataclass(frozen=True)
class SamplingConfig:
    """Sampling parameters shared by every policy backend."""

    #: softmax temperature; 0 means greedy decoding
    temperature: float = 1.0
    #: nucleus sampling mass
    top_p: float = 1.0
    #: top-k sampling (0 = off)
    top_k: int = 0
    #: the most tokens generated per turn (the per-turn token budget)
    max_new_tokens: int = 128
    #: generation stops right after the first of these strings
    stop: tuple[str, ...] = ("</answer>",)
    #: base seed of the sampler (combined with the rollout step for reproducibility)
    seed: int = 0


@dataclass
class Reply:
    """A policy's answer to one conversation.

    ``error`` is set when the backend failed (API error after retries): the rollout marks the
    episode as an error instead of stepping the env with an empty reply (docs/algorithms.md reference bug 8).
    """

    text: str
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    #: "stop" (a stop string) | "eos" | "length" (max_new_tokens) | "error" | "context_limit"
    #: (nothing generated: the context plus max_new_tokens would exceed the policy's context
    #: limit; the rollout truncates the episode before this turn)
    finish_reason: str = "stop"
    usage: dict[str, int] = field(default_factory=dict)  # prompt_tokens, completion_tokens
    error: str | None = None
    #: the weights version of the engine that sampled it (engines with pushed weights; else None):
    #: its first token's when ``token_versions`` is set
    weights_version: int | None = None
    #: per sampled token, when the reply spans weights versions (``rollout.interrupt``); else None
    token_versions: list[int] | None = None


@runtime_checkable
class Policy(Protocol):
    """Anything that answers a batch of conversations."""

    def act(self, conversations: Sequence[Conversation], sampling: SamplingConfig) -> list[Reply]: ...
