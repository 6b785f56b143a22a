"""Forward passes that work the same for Qwen-VL models (mRoPE) and text-only causal LMs.

Position ids are computed explicitly from ``attention_mask`` (never left to a model's cached
state): for Qwen2/2.5/3-VL the model's own ``get_rope_index`` gives the 3-D mRoPE positions of a
padded batch (pads skipped, images laid out on their (t, h, w) grid); for text models they are
``cumsum(attention_mask) - 1``. So a right- or left-padded batch gives, on its real tokens, the
same logits as each sequence alone (tested in tests/models/test_forward.py).
"""

from __future__ import annotations

import torch

from vagent.models.packing import pack, packable, packed_inputs


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


def forward_logits(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    pixel_values: torch.Tensor | None = None,
    image_grid_thw: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
    packed: bool = False,
) -> torch.Tensor:
    """Logits [B, L, V] (model dtype) of a VLM or text LM; logits[:, t] predict token t + 1.

    ``packed``: run the rows as one sequence without padding (:mod:`vagent.models.packing`; the
    same [B, L, V], zeros at the padding; ignored when ``position_ids`` are given)."""
    if packed and position_ids is None and packable(model):
        p = pack(model, input_ids, attention_mask, image_grid_thw)
        return p.unpack(model(**packed_inputs(model, p, pixel_values, image_grid_thw), use_cache=False).logits)
    kwargs = model_inputs(model, input_ids, attention_mask, pixel_values, image_grid_thw, position_ids)
    return model(**kwargs, use_cache=False).logits


def forward_hidden(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    pixel_values: torch.Tensor | None = None,
    image_grid_thw: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
    packed: bool = False,
) -> torch.Tensor:
    """Last hidden states [B, L, H] of the backbone (no LM head); ``packed`` as in :func:`forward_logits`."""
    if packed and position_ids is None and packable(model):
        p = pack(model, input_ids, attention_mask, image_grid_thw)
        out = backbone_of(model)(**packed_inputs(model, p, pixel_values, image_grid_thw), use_cache=False)
        return p.unpack(out.last_hidden_state)
    kwargs = model_inputs(model, input_ids, attention_mask, pixel_values, image_grid_thw, position_ids)
    return backbone_of(model)(**kwargs, use_cache=False).last_hidden_state


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """out[b, t] = log p(input_ids[b, t] | input_ids[b, :t]), float32 [B, L]; out[:, 0] = 0.

    logits: [B, L, V] from ``forward_logits`` on the same ``input_ids``. ``temperature`` divides
    the logits first (1.0 = the model's own distribution, what ``HFEngine`` reports). Computed
    row by row in float32 (``logit[target] - logsumexp(logits)``) to bound memory.
    """
    out = torch.zeros(input_ids.shape, dtype=torch.float32, device=logits.device)
    targets = input_ids[:, 1:]
    for b in range(logits.shape[0]):
        row = logits[b, :-1].float() / temperature  # [L-1, V]
        picked = row.gather(-1, targets[b].unsqueeze(-1)).squeeze(-1)
        out[b, 1:] = picked - torch.logsumexp(row, dim=-1)
    return out


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the next-token distribution at every position, float32 [B, L]."""
    out = torch.empty(logits.shape[:2], dtype=torch.float32, device=logits.device)
    for b in range(logits.shape[0]):
        logp = torch.log_softmax(logits[b].float(), dim=-1)
        out[b] = -(logp.exp() * logp).sum(-1)
    return out
