"""The critic (a scalar value head on a VLM / LM backbone) and the frozen reference model for KL.

``ValueModel``: V(t) = w . h_t + b on the backbone's last hidden state h_t at every position,
computed in float32. The head starts near zero (weight ~ N(0, 1e-3^2), bias 0), so initial
values are ~0 and early advantages are ~returns. By default the critic is a separate copy of the
policy's backbone (VAGEN: critic initialised from the actor checkpoint); ``share_backbone=True``
puts the head on the policy's own backbone (the policy and critic losses then both update the backbone; the
critic's ``parameters()`` then include the policy's, so give the optimizer the policy's
parameters once plus ``critic.value_head.parameters()``).

``reference_model``: a frozen deep copy of the policy, or, when the policy has LoRA adapters, the
same model with adapters disabled (no extra memory).
"""

from __future__ import annotations

import copy
import json
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import torch
from torch import nn

from vagent.models.forward import forward_hidden, forward_logits, unwrap
from vagent.models.loading import LoadedModel, enable_checkpointing, load_model

_HEAD_FILE = "value_head.pt"
_META_FILE = "vagent_value.json"


class ValueModel(nn.Module):
    """Value head on a backbone. ``backbone_model`` is a full HF model (LM or VLM, possibly PEFT);
    only its backbone (without the LM head) runs in ``forward``."""

    def __init__(self, backbone_model: nn.Module, *, shares_backbone: bool = False, init_std: float = 1e-3):
        super().__init__()
        self.backbone_model = backbone_model
        self.shares_backbone = shares_backbone
        hidden = unwrap(backbone_model).config.get_text_config().hidden_size
        self.value_head = nn.Linear(hidden, 1, dtype=torch.float32)
        device = next(backbone_model.parameters()).device
        with torch.no_grad():
            self.value_head.weight.normal_(0.0, init_std)
            self.value_head.bias.zero_()
        self.value_head.to(device)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        pixel_values: torch.Tensor | None = None,
        image_grid_thw: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        packed: bool = False,
    ) -> torch.Tensor:
        """Values [B, L] float32; values[:, t] is V of the prefix ending at token t (pads: garbage,
        mask them). ``packed``: the backbone runs the rows without padding (update.packing).

        A critic that shares the policy's backbone reads its features without a graph: the value
        loss trains the head only (the policy loss trains the backbone), so the backbone's
        backward pass for the value loss, whose gradients would be thrown away, is never run."""
        grad = torch.is_grad_enabled() and not self.shares_backbone
        with torch.set_grad_enabled(grad):
            hidden = forward_hidden(self.backbone_model, input_ids, attention_mask, pixel_values,
                                    image_grid_thw, position_ids, packed=packed)  # [B, L, H]
        return self.values_from_hidden(hidden)

    def values_from_hidden(self, hidden: torch.Tensor) -> torch.Tensor:
        """Values [B, L] float32 from the backbone's last hidden states [B, L, H] (the head alone:
        a shared-backbone critic reuses the policy's scoring pass this way)."""
        return self.value_head(hidden.float()).squeeze(-1)

    def save_pretrained(self, out_dir: str | Path) -> Path:
        """Write the head (and, unless shared with the policy, the backbone) to ``out_dir``."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        if not self.shares_backbone:
            unwrap(self.backbone_model).save_pretrained(out)
        torch.save({k: v.cpu() for k, v in self.value_head.state_dict().items()}, out / _HEAD_FILE)
        meta = {"shares_backbone": self.shares_backbone, "hidden_size": self.value_head.in_features}
        (out / _META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
        return out

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        *,
        backbone_model: nn.Module | None = None,
        dtype: str | torch.dtype = "auto",
        device: str | torch.device = "cpu",
    ) -> "ValueModel":
        """Load a critic saved by ``save_pretrained``. A critic that shared the policy's backbone
        needs that backbone passed as ``backbone_model``."""
        path = Path(path)
        meta_file = path / _META_FILE
        if not meta_file.is_file():
            raise FileNotFoundError(f"{path} is not a saved critic: no {_META_FILE} (save with ValueModel.save_pretrained)")
        meta = json.loads(meta_file.read_text())
        if backbone_model is None:
            if meta["shares_backbone"]:
                raise ValueError(f"critic in {path} shared the policy's backbone: pass backbone_model=policy.model")
            backbone_model = load_model(path, dtype=dtype, device=device)
        model = cls(backbone_model, shares_backbone=meta["shares_backbone"])
        state = torch.load(path / _HEAD_FILE, map_location="cpu", weights_only=True)
        model.value_head.load_state_dict(state)
        return model


def build_critic(
    policy: str | Path | LoadedModel,
    share_backbone: bool = False,
    *,
    dtype: str | torch.dtype = "auto",
    device: str | torch.device | None = None,
    gradient_checkpointing: bool = False,
    init_std: float = 1e-3,
) -> ValueModel:
    """A critic initialised from the policy's backbone.

    Args:
        policy: a model directory, or a ``LoadedModel``.
        share_backbone: put the head on the policy's own model (needs a ``LoadedModel``).
            Default False: a separate deep copy (LoRA adapters, if any, are merged into it).
    """
    if share_backbone:
        if not isinstance(policy, LoadedModel):
            raise ValueError("share_backbone=True needs the policy's LoadedModel, not a path")
        return ValueModel(policy.model, shares_backbone=True, init_std=init_std)
    if isinstance(policy, LoadedModel):
        model = policy.model
        if getattr(model, "get_base_model", None) is not None:  # PEFT: copy with adapters merged
            model = copy.deepcopy(model).merge_and_unload()
        else:
            model = copy.deepcopy(model)
        if device is not None:
            model.to(device)
    else:
        model = load_model(policy, dtype=dtype, device=device or "cpu")
    for p in model.parameters():
        p.requires_grad_(True)
    if gradient_checkpointing:
        enable_checkpointing(model)
    return ValueModel(model, shares_backbone=False, init_std=init_std)


class ReferenceModel:
    """The frozen reference policy pi_ref for the KL term.

    Use ``ref.forward_logits(...)`` (no grad), or ``with ref.active() as m:`` to run any forward
    on the reference weights. For a LoRA policy this is the policy model with adapters disabled
    (so never call it while a policy forward's graph is being built inside the same context).
    """

    def __init__(self, model: nn.Module, *, adapters_disabled: bool):
        self.model = model
        self.adapters_disabled = adapters_disabled

    @contextmanager
    def active(self) -> Iterator[nn.Module]:
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                if self.adapters_disabled:
                    with self.model.disable_adapter():
                        yield self.model
                else:
                    yield self.model
        finally:
            self.model.train(was_training)

    def forward_logits(self, input_ids, attention_mask, pixel_values=None, image_grid_thw=None,
                       position_ids=None) -> torch.Tensor:
        """Reference logits [B, L, V] (see ``vagent.models.forward.forward_logits``)."""
        with self.active() as m:
            return forward_logits(m, input_ids, attention_mask, pixel_values, image_grid_thw, position_ids)

    __call__ = forward_logits


def reference_model(loaded: LoadedModel) -> ReferenceModel:
    """pi_ref: adapters disabled for a LoRA policy, else a frozen deep copy made now."""
    model = loaded.model
    if getattr(model, "disable_adapter", None) is not None and getattr(model, "get_base_model", None) is not None:
        return ReferenceModel(model, adapters_disabled=True)
    frozen = copy.deepcopy(model)
    frozen.eval()
    for p in frozen.parameters():
        p.requires_grad_(False)
    return ReferenceModel(frozen, adapters_disabled=False)
