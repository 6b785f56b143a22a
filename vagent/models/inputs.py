"""Model inputs that work the same for Qwen-VL models (mRoPE) and text-only causal LMs: the HF model
inside a PEFT wrapper, its backbone, explicit position ids and the keyword arguments of a call.

The layer below :mod:`vagent.models.forward` (the forward passes) and :mod:`vagent.models.packing`
(packed sequences), which both build on it. See :mod:`vagent.models.forward` for how positions are
computed.
"""

from __future__ import annotations

import torch


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The HF ``PreTrainedModel`` inside a PEFT wrapper (LoRA layers stay in place)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def backbone_of(model: torch.nn.Module) -> torch.nn.Module:
    """The model without its LM head (e.g. ``Qwen2_5_VLModel`` inside ``...ForConditionalGeneration``)."""
    base = unwrap(model)
    return getattr(base, base.base_model_prefix, base)


def model_inputs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    pixel_values: torch.Tensor | None = None,
    image_grid_thw: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
) -> dict:
    """Keyword arguments for a model call, with explicit position ids.

    Shapes: input_ids, attention_mask [B, L]; pixel_values [n_patches, patch_dim] (all images of
    the batch in order); image_grid_thw [n_images, 3]; position_ids [3, B, L] for mRoPE models,
    [B, L] otherwise.
    """
    kwargs = dict(input_ids=input_ids, attention_mask=attention_mask)
    if pixel_values is not None:
        if image_grid_thw is None:
            raise ValueError("pixel_values given without image_grid_thw")
        kwargs.update(pixel_values=pixel_values, image_grid_thw=image_grid_thw)
    image_token_id = mrope_image_token_id(model)
    if image_token_id is not None:
        kwargs["mm_token_type_ids"] = (input_ids == image_token_id).int()
    if position_ids is None:
        position_ids = explicit_position_ids(model, input_ids, attention_mask, image_grid_thw)
    kwargs["position_ids"] = position_ids
    return kwargs


def mrope_image_token_id(model: torch.nn.Module) -> int | None:
    """The image placeholder id of a Qwen-VL (mRoPE) model; None for models with 1-D positions."""
    image_token_id = getattr(unwrap(model).config, "image_token_id", None)
    return image_token_id if hasattr(backbone_of(model), "get_rope_index") else None


def explicit_position_ids(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    image_grid_thw: torch.Tensor | None = None,
) -> torch.Tensor:
    """Position ids of a padded batch: [3, B, L] mRoPE positions from the model's own
    ``get_rope_index`` (pads skipped, images on their (t, h, w) grid), else [B, L]
    ``cumsum(attention_mask) - 1``."""
    image_token_id = mrope_image_token_id(model)
    if image_token_id is not None:
        position_ids, _ = backbone_of(model).get_rope_index(
            input_ids, mm_token_type_ids=(input_ids == image_token_id).int(), image_grid_thw=image_grid_thw,
            attention_mask=attention_mask,
        )
        return position_ids
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
