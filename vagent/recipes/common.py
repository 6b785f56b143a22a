"""Small functions the recipes share: the remote envs' check, devices, model set-up; the env seeds
and sampling settings of a step (``train_env_specs``, ``val_env_specs``, ``stop_strings``,
``sampling_for``) live below the recipes in :mod:`vagent.rollout.specs` and are re-exported here.

Nothing here is a trainer: each function does one thing and the recipes (ppo.py, grpo.py,
sft.py) call them in the order the algorithm runs. The rest of what the recipes share lives by
its seam: :mod:`vagent.recipes.optim` (seeds, optimizers, schedules), :mod:`vagent.recipes.tiny_cache`
(building and caching the tiny model), :mod:`vagent.recipes.scoring` (forward passes and the
scoring passes), :mod:`vagent.recipes.batching` (mini-/micro-batches and accumulation weights),
:mod:`vagent.recipes.validation` (validation and the episode summaries) and
:mod:`vagent.recipes.session` (the run record).
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Callable, Protocol, TypeGuard

import torch

from vagent.config import ConfigError
from vagent.envs import make
from vagent.envs.registry import IMPORT_HINT, list_envs
from vagent.models.forward import unwrap
from vagent.models.loading import LoadedModel, LoraSettings, load_policy
from vagent.runconfig import RunConfig
from vagent.rollout.specs import (  # noqa: F401 -- all but env_factory_for re-exported from their old home
    env_factory_for, sampling_for, stop_strings, train_env_specs, val_env_specs,
)
from vagent.runs.errors import ModelError
from vagent.service.preflight import check_env_servers

# ----------------------------------------------------------------------------------------------
# remote envs
# ----------------------------------------------------------------------------------------------


def check_remote_envs(cfg: RunConfig, say: Callable[[str], None]) -> None:
    """Before the model build: every server of every ``envs.N.urls`` answers, accepts the entry's
    token and serves its env (``say`` gets one line per server; a failure raises ConfigError with
    one line per failed server, :mod:`vagent.service.preflight`). SFT demonstrations are played in
    this process and the reasoning judges read the env module here (``judge_spec``, ``LEGEND``,
    ``describe_state``), so they need the env registered here too."""
    remote = [e for e in cfg.envs if e.urls]
    if not remote:
        return
    for line in check_env_servers(cfg.envs):
        say(line)
    local_only = [e.name for e in remote if e.name not in list_envs()]
    if cfg.sft.steps > 0 and not cfg.sft.data and local_only:
        raise ConfigError(f"sft.steps {cfg.sft.steps} plays solver demonstrations of {', '.join(local_only)} in this "
                          "process, but that env lives only on its server. Set sft.steps=0, give sft.data, or "
                          f"register the env here too. {IMPORT_HINT}")
    if cfg.reasoning_reward and local_only:
        raise ConfigError(f"reasoning_reward judges the descriptions of {', '.join(local_only)} with its env module "
                          "(judge_spec, LEGEND, describe_state), which lives only on its server. Set "
                          f"reasoning_reward: null, or register the env here too. {IMPORT_HINT}")


# ----------------------------------------------------------------------------------------------
# devices and precision
# ----------------------------------------------------------------------------------------------


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ModelError(f"device={name!r} but CUDA is not available here; use device=cpu or device=auto.")
    return dev


def use_bf16(setting: str, device: torch.device) -> bool:
    """bf16 autocast: ``auto`` turns it on for CUDA devices that support bf16 (off on CPU, where
    bf16 matmuls are usually slower than float32)."""
    if setting == "true":
        return True
    if setting == "false":
        return False
    return device.type == "cuda" and torch.cuda.is_bf16_supported()


# ----------------------------------------------------------------------------------------------
# models
# ----------------------------------------------------------------------------------------------


def load_model(cfg: RunConfig, path: Path, device: torch.device):
    """``load_policy`` with the run's dtype / LoRA / checkpointing; errors name the fix."""
    model_cfg, lora = cfg.model, None
    check_lora_rank(model_cfg.lora_rank, path)
    if model_cfg.lora_rank > 0:
        lora = LoraSettings(r=model_cfg.lora_rank, alpha=int(model_cfg.lora_alpha), dropout=model_cfg.lora_dropout)
    try:
        loaded = load_policy(path, dtype=model_cfg.dtype, device=device, lora=lora,
                             gradient_checkpointing=model_cfg.gradient_checkpointing,
                             trust_remote_code=model_cfg.trust_remote_code, min_pixels=model_cfg.min_pixels,
                             max_pixels=model_cfg.max_pixels, attn_implementation=model_cfg.attn_implementation)
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise ModelError(f"model.path: {exc}") from exc
    if cfg.model.freeze_vision:
        frozen = [p for n, p in loaded.model.named_parameters() if set(n.split(".")) & set(VISION_TOWER_NAMES)]
        if loaded.is_vision and not frozen:
            raise ModelError(f"model.freeze_vision: found no vision tower parameters in {path} "
                             f"(looked for modules named {VISION_TOWER_NAMES}).")
        for p in frozen:
            p.requires_grad_(False)
    return loaded


#: module names of vision towers in HF VLMs (Qwen2/2.5/3-VL: "visual")
VISION_TOWER_NAMES = ("visual", "vision_tower", "vision_model", "vision_encoder")


def check_lora_rank(rank: int, path: Path) -> None:
    """ConfigError when ``model.lora_rank`` is above the hidden size in the model's config.json
    (read before the model loads): an adapter ``B @ A`` on a layer of width d has rank at most d, so
    a larger rank only adds parameters and memory. A config.json without one is left to the loader."""
    if rank <= 0:
        return
    try:
        config = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return
    if not isinstance(config, dict):
        return
    text = config.get("text_config")  # a VLM's language model (Qwen2.5-VL, Qwen3-VL); else the model itself
    hidden = (text if isinstance(text, dict) else config).get("hidden_size", config.get("hidden_size"))
    if isinstance(hidden, int) and rank > hidden:
        raise ConfigError(f"model.lora_rank {rank} is above the hidden size of the model ({hidden}, "
                          f"{Path(path) / 'config.json'}): a LoRA adapter on a layer {hidden} wide has rank at most "
                          f"{hidden}, so a larger rank only adds parameters and memory. Set model.lora_rank <= "
                          f"{hidden} (8 to 64 is usual), or 0 to train every weight.")


def check_compatible(loaded: LoadedModel, cfg: RunConfig) -> None:
    """A text-only model cannot play an env that shows images: say so before training."""
    if loaded.is_vision:
        return
    for i, e in enumerate(cfg.envs):
        remote = env_factory_for(e)  # a remote env (envs.N.urls): its server's
        env = remote() if remote is not None else make(e.name, **e.config)
        try:
            obs, _ = env.reset(0)
        finally:
            env.close()
        if obs.images:
            raise ModelError(
                f"model {loaded.name} is text-only (no image processor / vision config) but env "
                f"'{e.name}' (envs.{i}) shows images. Use a vision-language model, or a text render: "
                f"envs.{i}.config.render=text."
            )


def export_policy(model: torch.nn.Module, source_dir: Path, out: Path) -> None:
    """Save the policy as a model directory that ``load_policy`` (and ``vagent eval``) can read:
    ``save_pretrained`` weights/config plus the tokenizer, chat template and image processor files
    of the source directory. A LoRA policy is saved merged into a copy of the base weights."""
    out.mkdir(parents=True, exist_ok=True)
    if _has_lora(model):
        save_pretrained(copy.deepcopy(model).merge_and_unload(), out)
    else:
        save_pretrained(unwrap(model), out)
    for f in Path(source_dir).iterdir():
        if f.is_file() and not f.name.endswith((".safetensors", ".bin")) and f.name not in ("config.json",
                                                                                             "generation_config.json"):
            if not (out / f.name).exists():
                shutil.copy2(f, out / f.name)


class LoraModel(Protocol):
    """A PEFT model with LoRA adapters: ``merge_and_unload()`` is the base model with them merged in."""

    def merge_and_unload(self) -> torch.nn.Module: ...


def _has_lora(model: torch.nn.Module) -> TypeGuard[LoraModel]:
    return getattr(model, "merge_and_unload", None) is not None


def save_pretrained(model: torch.nn.Module, out: Path) -> None:
    """``model.save_pretrained(out)`` (a Hugging Face model's weights and config)."""
    save = getattr(model, "save_pretrained", None)
    if save is None:
        raise TypeError(f"{type(model).__name__} has no save_pretrained: the policy must be a Hugging Face model "
                        "(vagent.models.load_policy loads one)")
    save(out)
