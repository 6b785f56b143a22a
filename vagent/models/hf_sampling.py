"""The pieces :class:`vagent.models.engine.HFEngine` samples with: the log-prob recorder (the tempered
policy's log-probability of each sampled token), token suppression, stop strings as an HF stopping
criterion, HF's sampling warpers, the placeholder ids a reply must never hold, and the seeding of a
call (one forked RNG per batch, or one generator per request).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Sequence

import torch
from transformers import (LogitsProcessor, StoppingCriteria, TemperatureLogitsWarper, TopKLogitsWarper,
                          TopPLogitsWarper)

from vagent.models.generation import GenerationRequest, SamplingParams
from vagent.models.processor import ChatEncoder
from vagent.models.stops import stop_window


class LogprobRecorder(LogitsProcessor):
    """Logits processor placed FIRST: keeps the raw log-softmax of the last step only and, at the
    next step, reads off the log-prob of the token that was sampled (O(B * V) memory, unlike
    ``output_logits`` which keeps every step)."""

    def __init__(self, temperature: float = 1.0) -> None:
        self.temperature = float(temperature)  # the sampling temperature: log pi is of logits / T
        self.prev: torch.Tensor | None = None  # [B, V] float32 log-softmax of the last step
        self.steps: list[torch.Tensor] = []  # each [B]

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.prev is not None:
            self.steps.append(self.prev.gather(-1, input_ids[:, -1:]).squeeze(-1))
        self.prev = torch.log_softmax(scores.float() / self.temperature, dim=-1)
        return scores

    def finish(self, sequences: torch.Tensor) -> torch.Tensor:
        """Log-probs of all generated tokens, [B, T] float32."""
        if self.prev is not None:
            self.steps.append(self.prev.gather(-1, sequences[:, -1:]).squeeze(-1))
            self.prev = None
        return torch.stack(self.steps, dim=1)


class SuppressTokens(LogitsProcessor):
    """Sets the logits of ``token_ids`` to -inf (never sampled, greedy or not)."""

    def __init__(self, token_ids: Sequence[int]):
        self.token_ids = list(token_ids)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        scores[:, self.token_ids] = float("-inf")
        return scores


class StopOnStrings(StoppingCriteria):
    """Per-row stopping criterion: the decoded tail of the row's generated ids contains a stop string."""

    def __init__(self, prompt_len: int, stop_strings: Sequence[str], decode: Callable[[list[int]], str]):
        self.prompt_len = prompt_len
        self.stop_strings = tuple(stop_strings)
        self.window = stop_window(stop_strings)
        self.decode = decode

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
        tails = input_ids[:, max(self.prompt_len, input_ids.shape[1] - self.window):].tolist()
        done = [any(s in self.decode(row) for s in self.stop_strings) for row in tails]
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)


def sampling_warpers(params: SamplingParams) -> list[LogitsProcessor]:
    """HF's temperature / top-k / top-p warpers for ``params`` (none when greedy)."""
    if not params.do_sample:
        return []
    warpers: list[LogitsProcessor] = []
    if params.temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(params.temperature))
    if params.top_k > 0:
        warpers.append(TopKLogitsWarper(params.top_k))
    if params.top_p < 1.0:
        warpers.append(TopPLogitsWarper(params.top_p))
    return warpers


def placeholder_token_ids(encoder: ChatEncoder, config: Any) -> list[int]:
    """Ids of the image / video placeholder tokens a reply must never contain."""
    ids = {encoder.image_token_id, getattr(config, "image_token_id", None), getattr(config, "video_token_id", None)}
    vocab = encoder.tokenizer.get_vocab()
    ids |= {vocab.get("<|image_pad|>"), vocab.get("<|video_pad|>")}
    return sorted(i for i in ids if i is not None)


def request_seeds(requests: Sequence[GenerationRequest]) -> list[int] | None:
    """The requests' own seeds (all set), None (none set); a mix is an error."""
    seeds = [r.seed for r in requests]
    if all(s is None for s in seeds):
        return None
    if any(s is None for s in seeds):
        raise ValueError("either every request of a generate() call carries a seed or none does "
                         f"(got seeds {seeds}); set GenerationRequest.seed on all of them")
    return [int(s) for s in seeds]  # type: ignore[arg-type]


def row_generators(seeds: list[int] | None, device: torch.device) -> list[torch.Generator] | None:
    """One generator per request seed (its draws depend on nothing else), or None."""
    if seeds is None:
        return None
    return [torch.Generator(device=device).manual_seed(s % (2**63)) for s in seeds]


@contextmanager
def seeded_rng(seed: int | None, device: torch.device):
    if seed is None:
        yield
        return
    devices = []
    if device.type == "cuda":
        devices = [device.index if device.index is not None else torch.cuda.current_device()]
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield
