"""Packed forward passes: the rows of a padded micro-batch as ONE sequence, no compute on padding.

``update.packing: true`` makes every scoring and update forward (log-probs, reference, critic
values) run this way. The helpers here take the padded ``[B, L]`` batch and give back ``[B, L, ...]``
tensors, so callers only pass a flag:

1. :func:`pack`: the real tokens of the rows, concatenated in row order -> ``input_ids [1, N]``
   (``N = sum of the row lengths``); the pixels of all images stay as they are (they are already in
   row order, then image order within the row, as the packed placeholders are);
2. position ids restart at 0 on every row: for a text LM ``[1, N]``; for Qwen2-VL / Qwen2.5-VL /
   Qwen3-VL the model's own 3-D mRoPE positions of each row (``get_rope_index`` on the padded
   batch, pads skipped, images on their (t, h, w) grid) cut out of the padding, with the text
   positions (0..l-1 per row) in front: ``[4, 1, N]``, the layout transformers reads packed
   Qwen-VL inputs from;
3. the model runs with ``attention_mask=None`` and attention confined to each row, by one of:

   - **row attention** (:func:`row_attention`; models on ``sdpa``, the default without
     ``flash_attn``, e.g. on a CPU): the linear and MLP layers run on all ``N`` packed tokens at
     once, attention runs as one causal SDPA call per row on that row's slice
     (:func:`rows_attention`, registered with transformers as ``vagent_rows``): no padding and no
     ``N x N`` mask, so attention's time grows with the sum of the rows' squared lengths, not with
     ``N ** 2``;
   - ``flash_attention_2`` (the ``flash_attn`` package on a GPU): transformers' varlen flash
     attention over the ``cu_seqlens`` it derives from the restarting positions;
   - the **block-diagonal mask** (fallback): transformers builds an ``N x N`` causal mask confined to
     each row from the restarting positions (``masking_utils.find_packed_sequence_indices``) and
     ``sdpa`` / ``eager`` attend over the whole packed sequence through it. Used with ``eager``
     attention, with gradient checkpointing (the backward pass re-runs the layers after the
     forward, outside the scope that selects row attention), and for models with sliding-window
     layers or attention soft-capping, which :func:`rows_attention` does not implement;
4. :func:`unpack` scatters the ``[1, N, ...]`` output back to ``[B, L, ...]`` (zeros on padding).

The numbers equal the padded forward's up to float rounding (tests/models/test_packing.py:
1e-5 in float32 for every tiny family, with 0, 1 and several images per row). Families whose
position ids this module does not know (:data:`PACKED_MODEL_TYPES`) run padded, with one warning
naming the family.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import torch
from torch import Tensor
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface

logger = logging.getLogger(__name__)

#: model types (``config.model_type``) with a packed path: 1-D rotary LMs and the mRoPE Qwen-VLs
PACKED_MODEL_TYPES = frozenset({
    "llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "qwen2_moe", "gemma", "gemma2", "gemma3_text", "phi3",
    "qwen2_vl", "qwen2_5_vl", "qwen3_vl",
})
_warned: set[str] = set()


@dataclass(frozen=True)
class Packed:
    """A padded ``[B, L]`` micro-batch as one sequence of ``N`` real tokens."""

    input_ids: Tensor  # [1, N] long: the rows' real tokens, in row order
    position_ids: Tensor  # [1, N] (text LM) or [4, 1, N] (mRoPE: text positions, then t / h / w)
    index: Tensor  # [N] long: flat position (b * L + t) of each packed token in the padded batch
    shape: tuple[int, int]  # (B, L) of the padded batch
    rows: tuple[tuple[int, int], ...]  # (start, end) of each non-empty row in the packed sequence

    def unpack(self, x: Tensor) -> Tensor:
        """``x`` [1, N, ...] -> [B, L, ...], zeros at the padding positions."""
        B, L = self.shape
        out = x.new_zeros((B * L, *x.shape[2:]))
        out[self.index] = x[0]
        return out.view(B, L, *x.shape[2:])


def model_type(model: torch.nn.Module) -> str:
    """The HF ``config.model_type`` of a model (inside a PEFT wrapper too)."""
    from vagent.models.inputs import unwrap

    return str(getattr(unwrap(model).config, "model_type", "unknown"))


def packable(model: torch.nn.Module) -> bool:
    """True when the model's family has a packed path; else warns once, naming the family (the
    caller then runs the padded forward)."""
    kind = model_type(model)
    if kind in PACKED_MODEL_TYPES:
        return True
    if kind not in _warned:
        _warned.add(kind)
        logger.warning("update.packing: model family %r has no packed path (known: %s); its forwards run padded",
                       kind, ", ".join(sorted(PACKED_MODEL_TYPES)))
    return False


def pack(model: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor,
         image_grid_thw: Tensor | None = None) -> Packed:
    """The packed form of a padded batch (module docstring, steps 1-2).

    Shapes: input_ids, attention_mask [B, L] (real tokens where the mask is 1, in any padding
    layout); image_grid_thw [n_images, 3] of all rows' images in row order.
    """
    from vagent.models.inputs import explicit_position_ids, mrope_image_token_id

    B, L = input_ids.shape
    real = attention_mask.bool()
    index = real.reshape(-1).nonzero()[:, 0]  # [N], row-major: rows in order, tokens in order
    text = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)  # [B, L]: 0..l-1 on each row's tokens
    ids = input_ids.reshape(-1)[index][None]  # [1, N]
    text_packed = text.reshape(-1)[index][None]  # [1, N]
    ends = real.sum(-1).cumsum(0).tolist()
    rows = tuple((s, e) for s, e in zip([0, *ends[:-1]], ends) if e > s)
    if mrope_image_token_id(model) is None:
        return Packed(ids, text_packed, index, (B, L), rows)
    rope = explicit_position_ids(model, input_ids, attention_mask, image_grid_thw)  # [3, B, L]
    rope_packed = rope.reshape(3, -1)[:, index][:, None]  # [3, 1, N]
    return Packed(ids, torch.cat([text_packed[None], rope_packed.to(text_packed.dtype)]), index, (B, L), rows)


def packed_inputs(model: torch.nn.Module, packed: Packed, pixel_values: Tensor | None,
                  image_grid_thw: Tensor | None, rows: bool = False) -> dict:
    """Keyword arguments of the packed model call: no attention mask (the restarting positions, or
    with ``rows`` the row bounds handed to :func:`rows_attention`, confine attention to each row),
    explicit positions, the images unchanged. ``rows``: the call runs inside :func:`row_attention`."""
    from vagent.models.inputs import model_inputs

    kwargs = model_inputs(model, packed.input_ids, torch.ones_like(packed.input_ids), pixel_values, image_grid_thw,
                          position_ids=packed.position_ids)
    kwargs["attention_mask"] = None
    if rows:
        kwargs[ROW_ATTENTION] = packed.rows
    return kwargs


#: the transformers attention implementation (and keyword argument) of :func:`rows_attention`
ROW_ATTENTION = "vagent_rows"


def rows_attention(module: torch.nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
                   dropout: float = 0.0, scaling: float | None = None,
                   vagent_rows: tuple[tuple[int, int], ...] | None = None, **kwargs) -> tuple[Tensor, None]:
    """Causal attention of a packed sequence, one SDPA call per row (a transformers attention function).

    query [1, heads, N, d], key / value [1, kv_heads, N, d]; ``vagent_rows``: (start, end) of each
    row along N (:attr:`Packed.rows`). Returns ([1, N, heads, d], None), the layout of transformers'
    ``sdpa_attention_forward``, which runs each row (grouped-query heads repeated there). Token t
    of a row attends to tokens start..t of that row only: what the padded batch computes for it.
    """
    if vagent_rows is None or attention_mask is not None:
        raise RuntimeError(f"{ROW_ATTENTION} attention runs packed sequences only: it needs the row bounds "
                           f"({ROW_ATTENTION}=...) and no attention mask; got bounds {vagent_rows is not None}, "
                           f"mask {attention_mask is not None}. Run the model through vagent.models.forward "
                           "with packed=True")
    sizes = [e - s for s, e in vagent_rows]  # the rows tile 0..N (packed tokens are all real)
    # split, not slicing: its backward is one concatenation, where each slice's would be an N-long zero tensor
    outs = [sdpa_attention_forward(module, q, k, v, None, dropout=dropout, scaling=scaling, is_causal=True)[0]
            for q, k, v in zip(query.split(sizes, 2), key.split(sizes, 2), value.split(sizes, 2))]
    return torch.cat(outs, 1), None


def _no_mask(*args, **kwargs) -> None:
    """The mask of :func:`rows_attention`: none (the row bounds confine attention)."""
    return None


AttentionInterface.register(ROW_ATTENTION, rows_attention)
AttentionMaskInterface.register(ROW_ATTENTION, _no_mask)


def row_attention_config(model: torch.nn.Module):
    """The config the text layers read their attention implementation from, when the packed
    forward of ``model`` can run :func:`rows_attention`; None when it runs the block-diagonal mask
    instead (module docstring, step 3: not ``sdpa``, gradient checkpointing, sliding-window layers,
    attention soft-capping)."""
    from vagent.models.inputs import unwrap

    base = unwrap(model)
    config = getattr(base, "config").get_text_config()  # a PreTrainedConfig (typed as Module | Tensor)
    checkpointing = getattr(base, "is_activation_checkpointing", None)  # older transformers: is_gradient_checkpointing
    if checkpointing is None:
        checkpointing = getattr(base, "is_gradient_checkpointing", False)
    if checkpointing or config._attn_implementation != "sdpa":
        return None
    if any(kind != "full_attention" for kind in getattr(config, "layer_types", None) or ()):
        return None
    if getattr(config, "use_sliding_window", True) and getattr(config, "sliding_window", None) is not None:
        return None
    if getattr(config, "attn_logit_softcapping", None) is not None:
        return None
    return config


@contextmanager
def row_attention(model: torch.nn.Module) -> Iterator[bool]:
    """Within this scope the text layers of ``model`` run :func:`rows_attention` (yields True), or
    nothing changes when :func:`row_attention_config` says the model cannot (yields False). Only
    the text config's implementation is switched (a vision tower keeps its own), and restored on
    exit; the switch holds for every call on this model object meanwhile, so nothing else may run
    it concurrently (another thread's forward would fail loudly in :func:`rows_attention`)."""
    config = row_attention_config(model)
    if config is None:
        yield False
        return
    previous = config._attn_implementation
    config._attn_implementation = ROW_ATTENTION
    try:
        yield True
    finally:
        config._attn_implementation = previous
