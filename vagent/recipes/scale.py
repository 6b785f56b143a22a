"""A recipe at the scale it was written for, and the same recipe at smoke scale.

Two things for configs written for a GPU count (``dist.nproc > 0``: the paper's recipes in
configs/paper/, docs/paper.md):

- :func:`preflight` runs in ``vagent train`` before any work (before torchrun starts, before a
  model is loaded): a Hugging Face model that is not downloaded yet fails with the exact
  ``hf download`` command; a run with a different number of processes says how each GPU's share
  of the step changes, and refuses when the training state cannot fit the GPUs' memory; on a
  machine without CUDA it refuses a full run in one line naming ``--smoke`` (``device=cpu`` forces
  the full run on the CPU).
- :func:`smoke_overrides` turns a recipe into its smoke run (``vagent train --smoke``): the model
  swapped for the tiny one and every size capped by one documented override set
  (configs/paper/smoke.yaml); every other setting is kept.

The memory figure is an estimate (weights, gradients and AdamW states sharded over the GPUs, plus
the whole policy gathered for generation; activations and the KV cache are not counted), and a
run is refused when it exceeds :data:`USABLE` of a GPU's memory (the rest is left for them).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

from vagent.config import ConfigError
from vagent.runconfig import RunConfig, preset_dir

#: the smoke override set of the paper's recipes
SMOKE_FILE = preset_dir() / "paper" / "smoke.yaml"
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
GIB = 1024**3
#: share of a GPU's memory the estimated training state may take (the rest: activations, KV cache, CUDA context)
USABLE = 0.9


@dataclass(frozen=True)
class SmokeSpec:
    """configs/paper/smoke.yaml: ``set`` (dotted key -> value; a key under a null section, such as
    ``reasoning_reward.judge`` of a run without the reward, is skipped), ``cap`` (dotted key ->
    upper bound: the value becomes min(recipe's value, cap), so sizes only shrink; ``envs.N.``
    applies to every env entry) and ``env_defaults`` (env config keys reset to the env's declared
    default: the CPU backend instead of AI2-THOR / ManiSkill, generated SVG targets instead of a
    dataset directory)."""

    set: dict[str, Any] = field(default_factory=dict)
    cap: dict[str, int] = field(default_factory=dict)
    env_defaults: tuple[str, ...] = ()


def read_smoke(path: str | Path = SMOKE_FILE) -> SmokeSpec:
    """The :class:`SmokeSpec` in ``path``."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"--smoke reads {path}, which does not exist (it ships in the repository's configs/paper/).")
    tree = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    unknown = set(tree) - {"set", "cap", "env_defaults"}
    if unknown:
        raise ConfigError(f"{path}: unknown keys {sorted(unknown)}; expected set, cap, env_defaults.")
    return SmokeSpec(dict(tree.get("set") or {}), dict(tree.get("cap") or {}), tuple(tree.get("env_defaults") or ()))


def _get(cfg: object, dotted: str) -> Any:
    node = cfg
    for part in dotted.split("."):
        if node is None:
            return None
        node = node[int(part)] if isinstance(node, list) else (
            node.get(part) if isinstance(node, dict) else getattr(node, part))
    return node


def _expand(cfg: RunConfig, key: str) -> list[str]:
    return [key.replace("envs.N.", f"envs.{i}.") for i in range(len(cfg.envs))] if "envs.N." in key else [key]


def smoke_overrides(cfg: RunConfig, spec: SmokeSpec | None = None) -> list[str]:
    """``key=value`` overrides that turn the loaded recipe ``cfg`` into its smoke run."""
    from vagent.envs.registry import env_class  # lazy: the registry loads PIL

    spec = spec or read_smoke()
    out = []
    for key, value in spec.set.items():
        parent = key.rsplit(".", 1)[0] if "." in key else ""
        for k in _expand(cfg, key):
            if parent and _get(cfg, k.rsplit(".", 1)[0]) is None:
                continue  # e.g. reasoning_reward.judge of a run without the reasoning reward
            out.append(f"{k}={json.dumps(value)}")
    for key, cap in spec.cap.items():
        for k in _expand(cfg, key):
            current = _get(cfg, k)
            if current is not None and current > cap:
                out.append(f"{k}={cap}")
    for i, entry in enumerate(cfg.envs):
        fields = env_class(entry.name).Config.__dataclass_fields__
        for name in spec.env_defaults:
            if name in entry.config and name in fields:
                out.append(f"envs.{i}.config.{name}={json.dumps(fields[name].default)}")
    return out


def applied_smoke(config: str | dict | None, smoke: bool) -> tuple[str, ...]:
    """The overrides ``--smoke`` applies to ``config`` (a file, a mapping, None: the default
    preset): :func:`smoke_overrides` of the loaded file; () without ``smoke``. The config summary
    lists the values they set as smoke mode's (vagent.runs.progress.ConfigSource.smoke)."""
    from vagent.runconfig import load_config

    return tuple(smoke_overrides(load_config(config, []))) if smoke else ()


def load_scaled(config: str | dict | None, overrides: list[str] | tuple[str, ...], smoke: bool) -> RunConfig:
    """``load_config(config, overrides)``; with ``smoke`` the smoke overrides (:func:`applied_smoke`)
    go between the file and the command line's overrides (which still win)."""
    from vagent.runconfig import load_config

    return load_config(config, [*applied_smoke(config, smoke), *overrides])


# --- preflight --------------------------------------------------------------------------------


def cached_model_dir(path: str) -> Path | None:
    """The local directory of ``model.path`` without downloading anything (None for "tiny");
    ConfigError with the ``hf download`` command when a hub model is not in the cache."""
    from vagent.models.loading import is_hub_id

    if path == "tiny":
        return None
    local: Path | None  # the model's folder; None while the hub cache has none
    if not is_hub_id(path):
        local = Path(path).expanduser()
        if not (local / "config.json").is_file():
            raise ConfigError(f"model.path {path!r} is not a model directory (no config.json). Pass a downloaded "
                              "checkpoint's directory, or a Hugging Face id such as Qwen/Qwen2.5-VL-3B-Instruct.")
        return local
    from huggingface_hub import constants, snapshot_download

    try:
        local = Path(snapshot_download(path, local_files_only=True))
    except Exception:  # noqa: BLE001 -- not cached, whatever huggingface_hub calls it
        local = None
    if local is None or not (local / "config.json").is_file() or not any(local.glob("*.safetensors")):
        raise ConfigError(
            f"model {path!r} is not downloaded yet (looked in the Hugging Face cache {constants.HF_HUB_CACHE}); "
            f"this recipe checks before any work instead of downloading in the middle of a job. Download it "
            f"once with:\n    hf download {path}\n(set HF_HOME / HF_HUB_CACHE to put the cache elsewhere; "
            f"or pass a local directory: model.path=/models/{path.split('/')[-1]})")
    return local


def count_parameters_on_disk(model_dir: Path) -> int:
    """Parameters of a checkpoint from its files: the safetensors index's total size (or the
    files' sizes) divided by the stored dtype's bytes (config.json ``torch_dtype`` / ``dtype``)."""
    conf = json.loads((model_dir / "config.json").read_text())
    stored = conf.get("torch_dtype") or conf.get("dtype") or "bfloat16"
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        total = int(json.loads(index.read_text()).get("metadata", {}).get("total_size", 0))
    else:
        total = sum(p.stat().st_size for p in model_dir.glob("*.safetensors"))
    return total // _DTYPE_BYTES.get(str(stored), 2)


def state_bytes_per_gpu(cfg: RunConfig, n_params: int, nproc: int) -> int:
    """Estimated bytes per GPU before activations: the policy's weights, gradients and AdamW
    states (3 more copies of the trainable part), a separate critic's the same, the KL reference's
    weights, all sharded over ``nproc`` (none with dist.cpu_offload), plus the whole policy
    gathered for generation."""
    b = _DTYPE_BYTES.get(cfg.model.dtype, 4)
    trainable = n_params if cfg.model.lora_rank == 0 else n_params // 100
    policy = n_params * b + trainable * 3 * b
    critic = policy if cfg.recipe == "ppo" and cfg.ppo.critic_backbone == "separate" else 0
    reference = n_params * b if cfg.update.kl_coef > 0 else 0
    sharded = 0 if cfg.dist.cpu_offload else (policy + critic + reference) / nproc
    return int(sharded + n_params * b)


def _cuda_memory() -> int | None:
    try:
        import torch

        return torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else None
    except Exception:  # noqa: BLE001 -- no usable CUDA: the memory check is skipped
        return None


def share_lines(cfg: RunConfig, nproc: int) -> list[str]:
    """What changes per GPU when a recipe written for ``dist.nproc`` GPUs runs on ``nproc``."""
    written = cfg.dist.nproc
    groups = sum(e.n_train for e in cfg.envs)
    group = cfg.rollout.group_size
    now, then = math.ceil(groups / nproc) * group, math.ceil(groups / written) * group
    if nproc == written:
        return []
    more = "more" if nproc < written else "fewer"
    return [f"this recipe was written for {written} GPUs (dist.nproc) and runs on {nproc}: each GPU plays up to "
            f"{now} of the step's {groups * group} episodes (written: {then}) and runs about {written / nproc:.2g}x "
            f"the update's micro-batches ({more} per GPU); the global batch, and so what a step learns, is the same "
            f"(docs/distributed.md), a step takes about {written / nproc:.2g}x as long."]


def preflight(cfg: RunConfig, nproc: int, gpu_bytes: int | None = None,
              say: Callable[[str], None] = print) -> None:
    """Checks of a recipe written for ``cfg.dist.nproc`` GPUs, run on ``nproc`` processes, before
    any work: the model is downloaded (else ConfigError with ``hf download``); on a machine without
    CUDA (``gpu_bytes`` None and no CUDA device 0) a full run is refused in one line naming
    ``--smoke``, unless ``device=cpu`` asks for it (:func:`refuse_without_gpus`); the per-GPU share is
    said, and a run whose training state cannot fit ``gpu_bytes`` per GPU (default: CUDA device 0's
    memory) is refused with the fixes."""
    if cfg.dist.nproc <= 0:
        return
    model_dir = cached_model_dir(cfg.model.path)
    if model_dir is None:  # the tiny model (a smoke run): nothing to weigh
        for line in share_lines(cfg, nproc):
            say(line)
        return
    gpu_bytes = gpu_bytes if gpu_bytes is not None else _cuda_memory()
    n_params = count_parameters_on_disk(model_dir)
    need = state_bytes_per_gpu(cfg, n_params, nproc)
    if gpu_bytes is None:
        refuse_without_gpus(cfg, need, n_params, nproc)  # before any other line: the refusal is the only one
    for line in share_lines(cfg, nproc):
        say(line)
    if gpu_bytes is None:
        say(f"estimated memory per GPU: {need / GIB:.0f} GiB before activations ({n_params / 1e9:.2f}B parameters, "
            f"{nproc} GPUs); no CUDA device here: the full recipe runs on the CPU, as device=cpu asks.")
        return
    if need > USABLE * gpu_bytes:
        fits = next((n for n in range(nproc + 1, 1025)
                     if state_bytes_per_gpu(cfg, n_params, n) <= USABLE * gpu_bytes), None)
        raise ConfigError(
            f"{cfg.model.path} ({n_params / 1e9:.2f}B parameters) does not fit {nproc} GPU(s) of "
            f"{gpu_bytes / GIB:.0f} GiB: weights, gradients and AdamW states of the policy"
            + (", the critic" if cfg.recipe == "ppo" and cfg.ppo.critic_backbone == "separate" else "")
            + (" and the KL reference" if cfg.update.kl_coef > 0 else "")
            + f" sharded over {nproc}, plus the policy gathered for generation, need about {need / GIB:.0f} GiB per "
            f"GPU before activations (an estimate; above {USABLE:.0%} of a GPU nothing is left for activations). "
            f"Fixes: run on {fits or 'more'} GPUs or more (--nproc; the recipe was written for {cfg.dist.nproc}); "
            "dist.cpu_offload=true (the states in CPU memory, slower); "
            "ppo.critic_backbone=shared (one backbone for policy and critic); or model.lora_rank=64.")
    say(f"estimated memory per GPU: {need / GIB:.0f} of {gpu_bytes / GIB:.0f} GiB before activations.")


def refuse_without_gpus(cfg: RunConfig, need: int, n_params: int, nproc: int) -> None:
    """ConfigError (one line) for a full run of a GPU recipe on a machine without CUDA, naming
    ``--smoke``; none when the config asks for the CPU (``device=cpu``: the user forces the full run
    there, knowing what it costs)."""
    if cfg.device == "cpu":
        return
    raise ConfigError(
        f"this recipe is written for {cfg.dist.nproc} GPUs (dist.nproc) and there is no CUDA device here: a full run "
        f"of {cfg.model.path} ({n_params / 1e9:.2f}B parameters, about {need / GIB:.0f} GiB per GPU on {nproc}) "
        "is not started on the CPU. Run it at smoke scale here with --smoke (the tiny model, sizes capped by "
        "configs/paper/smoke.yaml), or on a GPU machine; to run the full recipe on the CPU anyway, add device=cpu.")
