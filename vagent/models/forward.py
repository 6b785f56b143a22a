"""Forward passes that work the same for Qwen-VL models (mRoPE) and text-only causal LMs.

Position ids are computed explicitly from ``attention_mask`` (never left to a model's cached
state): for Qwen2/2.5/3-VL the model's own ``get_rope_index`` gives the 3-D mRoPE positions of a
padded batch (pads skipped, images laid out on their (t, h, w) grid); for text models they are
``cumsum(attention_mask) - 1``. So a right- or left-padded batch gives, on its real tokens, the
same logits as each sequence alone (tested in tests/models/test_forward.py).
"""

from __future__ import annotations

import torch

from vagent.models.inputs import backbone_of, explicit_position_ids, model_inputs, mrope_image_token_id, unwrap
from vagent.models.packing import pack, packable, packed_inputs, row_attention
from vagent.rl.losses import entropy_from_logits, logprobs_from_logits

__all__ = ["backbone_of", "explicit_position_ids", "forward_hidden", "forward_logits", "model_inputs",
           "mrope_image_token_id", "token_entropy", "token_logprobs", "unwrap"]


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
    return _forward(model, model, "logits", input_ids, attention_mask, pixel_values, image_grid_thw,
                    position_ids, packed)


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
    return _forward(model, backbone_of(model), "last_hidden_state", input_ids, attention_mask, pixel_values,
                    image_grid_thw, position_ids, packed)


def _forward(model: torch.nn.Module, net: torch.nn.Module, output: str, input_ids: torch.Tensor,
             attention_mask: torch.Tensor, pixel_values: torch.Tensor | None, image_grid_thw: torch.Tensor | None,
             position_ids: torch.Tensor | None, packed: bool) -> torch.Tensor:
    """``net`` (``model`` itself or its backbone) on the batch, the ``output`` field of its result
    ([B, L, ...]); inputs, positions and packing are built from ``model``."""
    if packed and position_ids is None and packable(model):
        p = pack(model, input_ids, attention_mask, image_grid_thw)
        with row_attention(model) as rows:
            out = net(**packed_inputs(model, p, pixel_values, image_grid_thw, rows), use_cache=False)
        return p.unpack(getattr(out, output))
    kwargs = model_inputs(model, input_ids, attention_mask, pixel_values, image_grid_thw, position_ids)
    return getattr(net(**kwargs, use_cache=False), output)


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """out[b, t] = log p(input_ids[b, t] | input_ids[b, :t]), float32 [B, L]; out[:, 0] = 0.

    logits: [B, L, V] from ``forward_logits`` on the same ``input_ids``. ``temperature`` divides
    the logits first (1.0 = the model's own distribution, what ``HFEngine`` reports). The math is
    :func:`vagent.rl.losses.logprobs_from_logits` (``logit[target] - logsumexp(logits)`` in
    float32), applied row by row to bound memory.
    """
    out = torch.zeros(input_ids.shape, dtype=torch.float32, device=logits.device)
    for b in range(logits.shape[0]):  # row b's logits at t predict its token t + 1
        out[b, 1:] = logprobs_from_logits(logits[b, :-1].float() / temperature, input_ids[b, 1:])
    return out


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the next-token distribution at every position, float32 [B, L]
    (:func:`vagent.rl.losses.entropy_from_logits`)."""
    return entropy_from_logits(logits)
