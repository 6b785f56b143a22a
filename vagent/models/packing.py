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
3. the model runs with ``attention_mask=None``: transformers then confines attention to each row
   from the restarting positions (``masking_utils.find_packed_sequence_indices``): with
   ``flash_attention_2`` (the ``flash_attn`` package on a GPU) as varlen flash attention over
   ``cu_seqlens``, with ``sdpa`` / ``eager`` (the CPU path) through a block-diagonal causal mask;
4. :func:`unpack` scatters the ``[1, N, ...]`` output back to ``[B, L, ...]`` (zeros on padding).

The numbers equal the padded forward's up to float rounding (tests/models/test_packing.py:
1e-5 in float32 for every tiny family, with 0, 1 and several images per row). Families whose
position ids this module does not know (:data:`PACKED_MODEL_TYPES`) run padded, with one warning
naming the family.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch import Tensor

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
    if mrope_image_token_id(model) is None:
        return Packed(ids, text_packed, index, (B, L))
    rope = explicit_position_ids(model, input_ids, attention_mask, image_grid_thw)  # [3, B, L]
    rope_packed = rope.reshape(3, -1)[:, index][:, None]  # [3, 1, N]
    return Packed(ids, torch.cat([text_packed[None], rope_packed.to(text_packed.dtype)]), index, (B, L))


def packed_inputs(model: torch.nn.Module, packed: Packed, pixel_values: Tensor | None,
                  image_grid_thw: Tensor | None) -> dict:
    """Keyword arguments of the packed model call: no attention mask (the restarting positions
    confine attention to each row), explicit positions, the images unchanged."""
    from vagent.models.inputs import model_inputs

    kwargs = model_inputs(model, packed.input_ids, torch.ones_like(packed.input_ids), pixel_values, image_grid_thw,
                          position_ids=packed.position_ids)
    kwargs["attention_mask"] = None
    return kwargs
