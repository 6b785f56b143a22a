"""What every generation engine takes and returns: :class:`SamplingParams`, :class:`GenerationRequest`,
:class:`GenerationOutput` and the :class:`Engine` protocol (the semantics shared by all engines are
in :mod:`vagent.models.engine`'s docstring, which re-exports these names).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, Sequence

if TYPE_CHECKING:  # annotations only: importing this module (a replica actor's class does) loads no torch
    import torch

FINISH_REASONS = ("stop", "eos", "length")
#: an engine's own finish reason for a reply stopped between decode steps (``HFEngine.interrupt``):
#: never a finished reply; the caller continues it (``RemoteEngine`` under ``rollout.interrupt``)
INTERRUPTED = "interrupted"


@dataclass(frozen=True)
class SamplingParams:
    """How to sample a reply.

    Attributes:
        temperature: softmax temperature (> 0) when sampling.
        top_p: nucleus sampling mass in (0, 1]; 1.0 = off.
        top_k: keep the k most likely tokens; 0 = off.
        max_new_tokens: reply length limit (tokens).
        stop_strings: end the reply right after the first of these appears (e.g. ``("</answer>",)``).
        do_sample: False = greedy decoding (temperature / top-p / top-k ignored).
        seed: when set, sampling is reproducible for the same batch of requests: the engine seeds
            torch inside a forked RNG and restores the caller's RNG state afterwards. None = use
            (and advance) the global torch RNG. Requests with their own ``GenerationRequest.seed``
            draw from per-request generators instead (independent of the batch).
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 256
    stop_strings: tuple[str, ...] = ()
    do_sample: bool = True
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.do_sample and self.temperature <= 0:
            raise ValueError(f"temperature must be > 0 when sampling (got {self.temperature}); "
                             "use do_sample=False for greedy decoding")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0 or self.max_new_tokens < 1:
            raise ValueError(f"need top_k >= 0 and max_new_tokens >= 1 (got {self.top_k}, {self.max_new_tokens})")
        if isinstance(self.stop_strings, str) or any(not s for s in self.stop_strings):
            raise ValueError(f"stop_strings must be a tuple of non-empty strings, got {self.stop_strings!r}")


@dataclass
class GenerationRequest:
    """One prompt. ``pixel_values`` [n_patches, patch_dim] and ``image_grid_thw`` [n_images, 3]
    are the prompt's images (as ``ChatEncoder`` built them), None for a text-only prompt.
    ``images`` optionally carries the raw PIL images, for backends that preprocess themselves
    (vLLM); ``HFEngine`` ignores it."""

    input_ids: list[int]
    pixel_values: torch.Tensor | None = None
    image_grid_thw: torch.Tensor | None = None
    images: tuple = field(default=())
    #: per-request sampling seed: this request's draws depend only on it (not on the batch it is
    #: in), so replies are the same however requests are batched or routed. All requests of a
    #: call carry one or none; None = the batch is seeded by ``SamplingParams.seed``
    seed: int | None = None
    #: routing key (e.g. the trajectory id): engines with replicas send equal keys to one replica
    #: (its prefix cache); engines without replicas ignore it
    key: Any = None


@dataclass
class GenerationOutput:
    """One reply: the sampled ids, their log-probs (see the module docstring), why it ended, its text,
    and (engines whose weights are pushed to them) the weights version that produced it."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    text: str
    weights_version: int | None = None
    #: the weights version of each sampled token when the reply spans versions (stopped by a push
    #: and continued on the new weights: ``rollout.interrupt``); None: every token is ``weights_version``
    token_versions: list[int] | None = None


class Engine(Protocol):
    """Anything that samples replies for a batch of requests."""

    def generate(self, requests: Sequence[GenerationRequest], params: SamplingParams) -> list[GenerationOutput]: ...
