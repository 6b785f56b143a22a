"""Generation backends: the ``Engine`` protocol and ``HFEngine`` (HF ``generate``, one batched call).

An engine turns token-level requests (prompt ids + the pixels of their images, as built by
``ChatEncoder``) into ``GenerationOutput``s holding EXACTLY the sampled token ids -- the rollout
appends them to the training sequence as they are (mask 1), never re-encoding text
(docs/algorithms.md reference bug 6).

Semantics shared by all engines:

- ``token_ids`` end right after the first stop string's last token (``finish_reason="stop"``),
  or include the EOS token when one was sampled (``"eos"``), or stop at ``max_new_tokens``
  (``"length"``). A stop string is found on the decoded text of the generated ids (special
  tokens skipped): the cut is the earliest token at which the decoded text contains it.
- ``logprobs[i]`` is the log-softmax of the model's logits divided by the sampling temperature
  T (``log_softmax(logits / T)``; T = 1 for greedy decoding), without top-k / top-p, of
  ``token_ids[i]``: the tempered policy's log-probability, what PPO's ratio needs when the
  recipes score at the rollout's temperature (``rl_temperature``). It is NOT the log-probability
  under the top-k / top-p truncated distribution. Recipes may recompute it anyway.
- ``text`` is ``decode(token_ids, skip_special_tokens=True)``.

Prefix reuse (``HFEngine(prefix_cache=True)``, the default): a multi-turn rollout asks, turn
after turn, for replies to prompts that EXTEND the previous turn's prompt and reply. The engine
keeps the KV cache of its last call and, for each request whose ids start with a row it holds
(prompt + fed reply tokens), feeds only the new tokens; every other request is prefilled whole in
the same batched call. The cache is dropped when the model's weights change (an optimizer step or
``load_state_dict`` bumps the parameters' in-place version counters) and is never used across
models. Positions are the full sequence's (mRoPE via the model's ``get_rope_index``), so logits
equal a fresh prefill's up to float rounding (tested). ``prefix_cache=False`` uses HF ``generate``.

The records and the protocol are :mod:`vagent.models.generation`, HF's sampling pieces
:mod:`vagent.models.hf_sampling` (both re-exported here). The vLLM backend lives in
``vagent.models.vllm_engine`` (lazy import; vLLM's CUDA build, or its CPU build in .venv-vllm:
scripts/vllm-env).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import AbstractSet, Any, Callable, Sequence

import torch
from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList

from vagent.models.forward import explicit_position_ids, mrope_image_token_id, unwrap
# the records and the protocol, and the HF sampling pieces, live beside this module; importable from here
from vagent.models.generation import (  # noqa: F401
    FINISH_REASONS, INTERRUPTED, Engine, GenerationOutput, GenerationRequest, SamplingParams,
)
from vagent.models.hf_sampling import (  # noqa: F401
    LogprobRecorder, StopOnStrings, SuppressTokens, placeholder_token_ids, request_seeds, row_generators,
    sampling_warpers, seeded_rng,
)
from vagent.models.processor import ChatEncoder
from vagent.models.stops import cut_reply, stop_window


@dataclass
class _HeldCache:
    """``HFEngine``'s KV cache from its last call (prefix reuse)."""

    cache: Any  # transformers Cache, batch = len(rows)
    mask: torch.Tensor  # [B, P] long: 1 where a position holds one of the row's tokens
    rows: list[tuple[int, ...]]  # the ids at each row's unmasked positions, in order
    version: tuple[int, int]  # HFEngine._weights_version() when it was built


class HFEngine:
    """``Engine`` on HF ``generate``: one batched, left-padded call with the KV cache.

    Requests may carry different numbers of images; their pixels are concatenated in request
    order. The model is put in eval mode for the call (no dropout, e.g. LoRA dropout) and its
    previous mode restored. Sampling settings from the checkpoint's ``generation_config``
    (Qwen ships ``top_k=1``, ``repetition_penalty=1.05``) are overridden: only ``SamplingParams``
    count.

    ``suppress_token_ids`` are never sampled; by default the image / video placeholder tokens
    (``<|image_pad|>``, ``<|video_pad|>``): a sampled placeholder would make the training forward
    look for pixels that do not exist (a random-weight model does sample them). Their removal
    happens after the log-prob recorder, so ``logprobs`` stay the model's own.
    """

    def __init__(self, model: torch.nn.Module, encoder: ChatEncoder, *,
                 suppress_token_ids: Sequence[int] | None = None, prefix_cache: bool = True):
        self.model = model
        self.encoder = encoder
        config = unwrap(model).config
        self._image_token_id = getattr(config, "image_token_id", None)
        self._mrope = mrope_image_token_id(model) is not None
        vision = getattr(config, "vision_config", None)
        self._merge = int(getattr(vision, "spatial_merge_size", 1) or 1) if vision is not None else 1
        if suppress_token_ids is None:
            suppress_token_ids = placeholder_token_ids(encoder, config)
        self.suppress_token_ids: list[int] = sorted(set(suppress_token_ids))
        #: keep the last call's KV cache and feed only the new tokens of requests that extend it
        self.prefix_cache = bool(prefix_cache)
        self._held: _HeldCache | None = None
        #: counters since construction: prompt tokens fed to the model vs. taken from the cache
        self.stats = {"prompt_tokens": 0, "reused_tokens": 0}
        #: asked between decode steps of the prefix-reusing path: True stops every unfinished reply
        #: with finish reason ``"interrupted"`` and the tokens so far (an engine replica sets it to
        #: "a weight push is waiting" under ``rollout.interrupt``; the caller continues the reply)
        self.interrupt: Callable[[], bool] | None = None

    def reset_cache(self) -> None:
        """Forget the held KV cache (the next call prefills every prompt whole)."""
        self._held = None

    def _weights_version(self) -> tuple[int, int]:
        """Changes whenever a parameter is modified in place (optimizer step, load_state_dict)."""
        return id(self.model), sum(p._version for p in self.model.parameters())

    def decode(self, ids: list[int]) -> str:
        return self.encoder.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def _batch(self, requests: Sequence[GenerationRequest], device: torch.device) -> dict[str, Any]:
        """Left-pad the prompts: input_ids / attention_mask [B, L]; images concatenated in order."""
        self._check(requests)
        length = max(len(r.input_ids) for r in requests)
        ids = torch.full((len(requests), length), self.encoder.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(requests), length), dtype=torch.long)
        pixels, grids = [], []
        for i, r in enumerate(requests):
            ids[i, length - len(r.input_ids):] = torch.tensor(r.input_ids, dtype=torch.long)
            mask[i, length - len(r.input_ids):] = 1
            if r.pixel_values is not None:
                pixels.append(r.pixel_values)
                grids.append(r.image_grid_thw)
        batch: dict[str, Any] = dict(input_ids=ids.to(device), attention_mask=mask.to(device))
        if pixels:
            batch["pixel_values"] = torch.cat(pixels).to(device)
            batch["image_grid_thw"] = torch.cat(grids).to(device)
        if self._mrope:
            batch["mm_token_type_ids"] = (batch["input_ids"] == self._image_token_id).int()
        return batch

    def generate(self, requests: Sequence[GenerationRequest], params: SamplingParams) -> list[GenerationOutput]:
        if request_seeds(requests) is not None and params.do_sample and not self.prefix_cache:
            # HF generate draws from one RNG for the batch: a seeded request runs alone, seeded
            return [self._generate_hf([r], dataclasses.replace(params, seed=r.seed))[0] for r in requests]
        if self.prefix_cache:
            return self._generate_cached(requests, params)
        return self._generate_hf(requests, params)

    def _generate_hf(self, requests: Sequence[GenerationRequest], params: SamplingParams) -> list[GenerationOutput]:
        """One HF ``generate`` call on the left-padded batch (no state kept between calls)."""
        device = next(self.model.parameters()).device
        batch = self._batch(requests, device)
        prompt_len = batch["input_ids"].shape[1]
        recorder = LogprobRecorder(params.temperature if params.do_sample else 1.0)
        processors = [recorder]  # sees the raw logits: HF's own warpers are all switched off below
        if self.suppress_token_ids:
            processors.append(SuppressTokens(self.suppress_token_ids))
        processors += sampling_warpers(params)
        stopping = [StopOnStrings(prompt_len, params.stop_strings, self.decode)] if params.stop_strings else []
        # Explicit values override the checkpoint's generation_config (None would inherit it).
        # HF's own warpers are set to no-ops: ours above run after the recorder saw raw logits.
        warpers_off = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, typical_p=1.0,
                           epsilon_cutoff=0.0, eta_cutoff=0.0) if params.do_sample else {}
        config = GenerationConfig(
            do_sample=params.do_sample, **warpers_off, repetition_penalty=1.0, no_repeat_ngram_size=0,
            max_new_tokens=params.max_new_tokens, eos_token_id=list(self.encoder.eos_token_ids),
            pad_token_id=self.encoder.pad_token_id, return_dict_in_generate=True, use_cache=True, num_beams=1,
        )
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad(), seeded_rng(params.seed, device):
                out = self.model.generate(
                    **batch, generation_config=config,
                    logits_processor=LogitsProcessorList(processors),
                    stopping_criteria=StoppingCriteriaList(stopping),
                )
        finally:
            self.model.train(was_training)
        generated = out.sequences[:, prompt_len:].tolist()
        logprobs = recorder.finish(out.sequences).tolist()
        return self._outputs(generated, logprobs, params)

    def _outputs(self, generated: list[list[int]], logprobs: list[list[float]],
                 params: SamplingParams, stopped: AbstractSet[int] = frozenset()) -> list[GenerationOutput]:
        results = []
        for k, (row, lps) in enumerate(zip(generated, logprobs)):
            n, reason = cut_reply(row, self.encoder.eos_token_ids, self.decode, params.stop_strings)
            if k in stopped and reason == "length":  # stopped by ``interrupt`` before any end
                reason = INTERRUPTED
            elif reason == "length" and n < params.max_new_tokens:
                raise RuntimeError(f"generation ended after {n} < max_new_tokens tokens without eos or stop "
                                   "string; this is a bug in HFEngine")
            ids = row[:n]
            results.append(GenerationOutput(ids, lps[:n], reason, self.decode(ids)))
        return results

    # ------------------------------------------------------------------ prefix-reusing path
    def _check(self, requests: Sequence[GenerationRequest]) -> None:
        """Errors for an empty batch, an empty prompt, or images for a model without image support."""
        if not requests:
            raise ValueError("generate() needs at least one request")
        for i, r in enumerate(requests):
            if not r.input_ids:
                raise ValueError(f"request {i} has no input_ids")
            if r.pixel_values is not None and not self.encoder.is_vision:
                raise ValueError(f"request {i} has images but model {self.encoder.name} has no image support")

    def _images_in(self, request: GenerationRequest, n_prefix: int) -> tuple[int, int] | None:
        """(images, pixel rows) wholly inside ``input_ids[:n_prefix]``; None when the prefix would
        end inside an image's placeholder run (no reuse then: tokens never leave their pixels)."""
        ids = request.input_ids
        img = self._image_token_id
        if img is None or request.image_grid_thw is None:
            return 0, 0
        if n_prefix < len(ids) and ids[n_prefix] == img and ids[n_prefix - 1] == img:
            return None
        tokens = sum(1 for t in ids[:n_prefix] if t == img)
        images = rows = 0
        for grid in request.image_grid_thw.tolist():
            if tokens == 0:
                break
            per = grid[0] * grid[1] * grid[2]
            tokens -= per // (self._merge ** 2)
            images, rows = images + 1, rows + per
        return (images, rows) if tokens == 0 else None

    def _match(self, requests: Sequence[GenerationRequest], held: _HeldCache) -> tuple[list[int], list[int]]:
        """For each request: the held row it extends (-1 = none) and how many of its ids that row holds."""
        tables: dict[int, dict[tuple[int, ...], int]] = {}
        for j, row in enumerate(held.rows):
            tables.setdefault(len(row), {})[row] = j
        src, n_prefix = [-1] * len(requests), [0] * len(requests)
        for i, r in enumerate(requests):
            for length in sorted(tables, reverse=True):  # the longest held prefix wins
                if length >= len(r.input_ids):
                    continue
                j = tables[length].get(tuple(r.input_ids[:length]))
                if j is not None and self._images_in(r, length) is not None:
                    src[i], n_prefix[i] = j, length
                    break
        return src, n_prefix

    def _positions(self, requests: Sequence[GenerationRequest], n_prefix: list[int], width: int,
                   device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Positions of the new (right-aligned, ``width`` wide) block and the next position per row:
        each WHOLE sequence's positions (``explicit_position_ids``, as a training forward computes
        them: [3, B, width] mRoPE, else [B, width]), sliced to its new tokens. Pads get 0 (masked)."""
        b = len(requests)
        pos = torch.zeros((3, b, width) if self._mrope else (b, width), dtype=torch.long)
        nxt = []
        for i, r in enumerate(requests):
            ids = torch.tensor([r.input_ids], dtype=torch.long)
            full = explicit_position_ids(self.model, ids, torch.ones_like(ids), r.image_grid_thw).cpu()
            n = len(r.input_ids) - n_prefix[i]
            pos[..., i, width - n:] = full[..., 0, n_prefix[i]:]
            nxt.append(int(full.max()) + 1)
        return pos.to(device), torch.tensor(nxt, dtype=torch.long, device=device)

    def _step_positions(self, nxt: torch.Tensor) -> torch.Tensor:
        pos = nxt.view(-1, 1)
        return pos.unsqueeze(0).expand(3, -1, -1) if self._mrope else pos

    def _generate_cached(self, requests: Sequence[GenerationRequest], params: SamplingParams) -> list[GenerationOutput]:
        """Prefill only what the held cache lacks, then decode token by token (module docstring)."""
        self._check(requests)
        device = next(self.model.parameters()).device
        version = self._weights_version()
        held, self._held = self._held, None
        if held is not None and held.version != version:
            held = None
        b = len(requests)
        src, n_prefix = self._match(requests, held) if held is not None else ([-1] * b, [0] * b)
        cache, prev_mask = None, torch.zeros((b, 0), dtype=torch.long, device=device)
        if held is not None and any(j >= 0 for j in src):
            index = torch.tensor([max(j, 0) for j in src], dtype=torch.long, device=device)
            cache = held.cache
            cache.reorder_cache(index)
            prev_mask = held.mask.index_select(0, index)
            prev_mask[torch.tensor([j < 0 for j in src], device=device)] = 0
        else:
            n_prefix = [0] * b

        # the new block: each request's ids beyond its held prefix, left-padded
        width = max(len(r.input_ids) - n for r, n in zip(requests, n_prefix))
        ids = torch.full((b, width), self.encoder.pad_token_id, dtype=torch.long)
        block_mask = torch.zeros((b, width), dtype=torch.long)
        pixels, grids = [], []
        for i, r in enumerate(requests):
            new = r.input_ids[n_prefix[i]:]
            ids[i, width - len(new):] = torch.tensor(new, dtype=torch.long)
            block_mask[i, width - len(new):] = 1
            if r.pixel_values is not None:
                images, rows = self._images_in(r, n_prefix[i])  # type: ignore[misc]
                if images < len(r.image_grid_thw):
                    pixels.append(r.pixel_values[rows:])
                    grids.append(r.image_grid_thw[images:])
        ids, mask = ids.to(device), torch.cat([prev_mask, block_mask.to(device)], 1)
        positions, nxt_pos = self._positions(requests, n_prefix, width, device)
        inputs: dict[str, Any] = dict(input_ids=ids, attention_mask=mask, position_ids=positions)
        if pixels:
            inputs.update(pixel_values=torch.cat(pixels).to(device), image_grid_thw=torch.cat(grids).to(device))
        if self._mrope:
            inputs["mm_token_type_ids"] = (ids == self._image_token_id).int()
        self.stats["prompt_tokens"] += sum(len(r.input_ids) for r in requests)
        self.stats["reused_tokens"] += sum(n_prefix)

        tau = params.temperature if params.do_sample else 1.0
        rows_rng = row_generators(request_seeds(requests), device) if params.do_sample else None
        warpers = sampling_warpers(params)
        eos = set(self.encoder.eos_token_ids)
        window = stop_window(params.stop_strings) if params.stop_strings else 0
        fed = [list(r.input_ids) for r in requests]  # what each cache row holds (unmasked positions)
        generated: list[list[int]] = [[] for _ in requests]
        logprobs: list[list[float]] = [[] for _ in requests]
        active = [True] * b
        stopped: set[int] = set()  # rows stopped by ``interrupt`` (their reply continues elsewhere)
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad(), seeded_rng(params.seed, device):
                out = self.model(**inputs, past_key_values=cache, use_cache=True, logits_to_keep=1)
                for step in range(params.max_new_tokens):
                    logits = out.logits[:, -1].float()
                    logp = torch.log_softmax(logits / tau, dim=-1)
                    if self.suppress_token_ids:
                        logits[:, self.suppress_token_ids] = float("-inf")
                    for warp in warpers:
                        logits = warp(ids, logits)
                    if params.do_sample and rows_rng is not None:  # per-request seeds: row i draws from its own RNG
                        probs = torch.softmax(logits, dim=-1)
                        token = torch.cat([torch.multinomial(probs[i:i + 1], 1, generator=g)
                                           for i, g in enumerate(rows_rng)]).squeeze(1)
                    elif params.do_sample:
                        token = torch.multinomial(torch.softmax(logits, dim=-1), 1).squeeze(1)
                    else:
                        token = logits.argmax(-1)
                    picked = logp.gather(-1, token[:, None]).squeeze(1).tolist()
                    fresh = list(active)  # rows whose token this step is real
                    for i, (t, lp) in enumerate(zip(token.tolist(), picked)):
                        if not active[i]:
                            continue
                        generated[i].append(t)
                        logprobs[i].append(lp)
                        if (t in eos or len(generated[i]) >= params.max_new_tokens or (window and any(
                                s in self.decode(generated[i][-window:]) for s in params.stop_strings))):
                            active[i] = False
                    if not any(active):
                        break
                    if self.interrupt is not None and self.interrupt():  # a push waits: stop here
                        stopped = {i for i in range(b) if active[i]}
                        break
                    feed = torch.tensor(fresh, device=device)
                    token = torch.where(feed, token, torch.full_like(token, self.encoder.pad_token_id))
                    mask = torch.cat([mask, feed.long()[:, None]], 1)
                    out = self.model(input_ids=token[:, None], attention_mask=mask,
                                     position_ids=self._step_positions(nxt_pos), past_key_values=out.past_key_values,
                                     use_cache=True, logits_to_keep=1)
                    nxt_pos = nxt_pos + feed.long()
                    for i, t in enumerate(token.tolist()):
                        if fresh[i]:
                            fed[i].append(t)
        finally:
            self.model.train(was_training)
        self._held = _HeldCache(out.past_key_values, mask, [tuple(f) for f in fed], version)
        return self._outputs(generated, logprobs, params, stopped)
