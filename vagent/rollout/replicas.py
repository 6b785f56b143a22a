"""The generators apart from the trainer's model that ``RolloutDriver`` rolls out with, and the
weight push that keeps them on the trainer's weights (see :mod:`vagent.rollout.driver`).

- :func:`engine_replicas`: a ``RemoteEngine`` over ``rollout.replicas`` Ray actors (hf copies of
  the policy, or vLLM engines on the run's model directory), shared by every rank of a job.
- :func:`push_weights`: the trainer's weights to a generator, versioned by the step; in a job of
  several ranks the ranks gather the sharded weights and rank 0 alone pushes them.
- :func:`merge_lora_into_state`: a LoRA policy's weights as the base checkpoint's (what vLLM loads).
- :func:`vllm_settings`: a run config's ``VLLMEngine`` keyword arguments.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence

if TYPE_CHECKING:  # torch, the model loader and the run config stay out of `import vagent.rollout.driver`
    import torch
    from torch.distributed import ProcessGroup

    from vagent.models.engine import GenerationOutput, GenerationRequest, SamplingParams
    from vagent.models.loading import LoadedModel
    from vagent.runconfig import RunConfig

#: a zero-argument maker of an unsharded copy of the policy (``Session.load_fresh_model``)
FreshModel = Callable[[], "torch.nn.Module"]


class PushedEngine(Protocol):
    """A generator apart from the trainer's model, whose weights are pushed to it (``RemoteEngine``,
    ``VLLMEngine``); every reply carries the ``weights_version`` that sampled it."""

    #: the version of the last push (the trainer's step)
    weights_version: int

    def generate(self, requests: Sequence[GenerationRequest], params: SamplingParams) -> list[GenerationOutput]: ...

    def update_weights(self, model: torch.nn.Module, version: int) -> int:
        """Take the weights of ``model`` as ``version`` (one process)."""
        ...

    def update_state(self, state: dict[str, torch.Tensor], version: int) -> int:
        """Take a full state dict as ``version`` (rank 0 of a job, after the ranks gathered it)."""
        ...

    def update_adapter(self, state: dict[str, torch.Tensor], lora_config: dict[str, Any], version: int) -> int:
        """Take a LoRA adapter (its ``lora_`` tensors, its PEFT config as a dict) as ``version``
        (engines built to serve adapters: ``takes_adapters``)."""
        ...


def push_weights(engine: PushedEngine, model: torch.nn.Module, version: int) -> None:
    """Send the trainer's weights to ``engine`` as ``version``. One process: ``update_weights``. A job
    of several ranks with a sharded policy: every rank takes part in gathering the full weights,
    rank 0 pushes them to the shared replicas (``update_state``), and no rank goes on before the
    push is done."""
    from vagent.distributed import barrier, full_state_dict, root_of, world
    from vagent.models.forward import unwrap
    from vagent.models.remote import adapter_names

    w = world()
    if not w.distributed or root_of(model) is None:
        engine.update_weights(model, version)
        return
    full = full_state_dict(model, to_all_ranks=False)
    if w.rank == 0:
        state = _base_model_keys(full)
        adapter = adapter_names(model) is not None
        if adapter and getattr(engine, "takes_adapters", False):  # vLLM built with lora_rank: the adapter only
            peft_config: dict[str, Any] = getattr(unwrap(model), "peft_config")
            config = peft_config["default"].to_dict()
            engine.update_adapter({k: v for k, v in state.items() if "lora_" in k}, config, version)
        else:
            if getattr(engine, "takes_merged_weights", False):  # vLLM: LoRA merged into the base weights
                state = merge_lora_into_state(state, model)
            elif adapter:  # hf replicas of a LoRA policy: the adapter tensors only
                state = {k: v for k, v in state.items() if "lora_" in k}
            engine.update_state(state, version)
    else:
        engine.weights_version = version
    barrier("engine weights pushed")


def vllm_settings(cfg: RunConfig, loaded: LoadedModel) -> dict:
    """``VLLMEngine`` keyword arguments of a run config: its memory share, seed, the trainer's
    parameter dtype (so that greedy replies equal the trainer's) unless ``rollout.engine_dtype``
    names another, and the context length."""
    import torch

    dtype = next(loaded.model.parameters()).dtype
    trainer = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}[dtype]
    out = {"gpu_memory_utilization": cfg.rollout.vllm_gpu_memory, "seed": cfg.seed,
           "dtype": trainer if cfg.rollout.engine_dtype == "auto" else cfg.rollout.engine_dtype}
    if cfg.model.max_context_tokens:
        out["max_model_len"] = cfg.model.max_context_tokens
    if cfg.model.lora_rank > 0:  # a LoRA policy's pushes are its adapter (a LoRARequest), not merged weights
        out["lora_rank"] = cfg.model.lora_rank
    return out


def saved_model_dir(model_dir: str | Path | None) -> str | Path:
    """``model_dir``, which vLLM loads; an error when the policy was not saved on disk."""
    if model_dir is None:
        raise ValueError("rollout.engine vllm needs the policy saved on disk (the run's model directory)")
    return model_dir


#: seconds the ranks of a job wait for each other while the replicas start (Ray start with retries,
#: actor creation, joining): at least this, or the job's dist.timeout_s when longer
STARTUP_TIMEOUT_S = 1800.0


def engine_replicas(cfg: RunConfig, loaded: LoadedModel, fresh_model: FreshModel | None = None,
                    model_dir: str | Path | None = None) -> tuple[PushedEngine, bool]:
    """(``RemoteEngine`` over ``rollout.replicas`` Ray actors, whether this process started Ray).

    One process: a local cluster is started (or joined: ``RAY_ADDRESS``); hf replicas copy the
    trainer's model, vllm replicas load ``model_dir`` (``make_driver`` then pushes the trainer's
    weights). A job of several ranks: rank 0 starts or joins the cluster and creates named replicas
    (hf: from the gathered full weights, loaded into ``fresh_model()``); the other ranks join rank
    0's cluster and attach to the same replicas, so every rank rolls out its share of the episodes
    on one shared pool (routing, retries and weight versions as in one process). Weights are pushed
    by rank 0 (``push_weights``) after the ranks gather them.
    """
    from vagent.distributed import barrier, broadcast_object, full_state_dict, on_group, side_group, world
    from vagent.models.remote import RemoteEngine, import_ray, join_ray, start_ray

    ray = import_ray()
    w = world()
    if not w.distributed:
        owns = not ray.is_initialized()
        start_ray()
        return _new_replicas(cfg, loaded, loaded.model, model_dir), owns
    # every rank takes part; rank 0 gets the weights (vllm replicas load model_dir and are pushed next)
    full = full_state_dict(loaded.model, to_all_ranks=False) if cfg.rollout.engine == "hf" else None
    # starting Ray and the replicas (rank 0), joining and attaching (the others) may take minutes on a
    # busy machine: the ranks wait for each other on a group whose timeout allows it, not the job's
    slow = side_group("engine replicas start", timeout_s=max(w.timeout_s, STARTUP_TIMEOUT_S))
    if w.rank == 0:
        engine, owns, pool = _start_named_replicas(cfg, loaded, full, fresh_model, model_dir, slow)
        with on_group(slow):
            broadcast_object(pool, "engine replicas")
    else:
        with on_group(slow):
            pool = broadcast_object(_Pool(error="rank 0 sent nothing"), "engine replicas")
        if pool.error is not None:
            raise RuntimeError(f"rank 0 could not start the engine replicas: {pool.error}")
        owns = join_ray(pool.address)
        engine = RemoteEngine.attach(pool.names, loaded.encoder, push_timeout_s=cfg.rollout.push_timeout_s,
                                     generate_timeout_s=cfg.rollout.generate_timeout_s)
    with on_group(slow):
        barrier("engine replicas attached")
    return engine, owns


@dataclass(frozen=True)
class _Pool:
    """What rank 0 of a job tells the other ranks about the replicas it started: the Ray cluster's
    address and the replicas' names, or why it could not start them."""

    address: str = ""
    names: tuple[str, ...] = ()
    error: str | None = None


def _start_named_replicas(cfg: RunConfig, loaded: LoadedModel, full: dict[str, torch.Tensor] | None,
                          fresh_model: FreshModel | None, model_dir: str | Path | None,
                          slow: ProcessGroup | None) -> tuple[PushedEngine, bool, _Pool]:
    """Rank 0 of a job: (the named replicas, whether it started Ray, what the other ranks need to
    attach: the cluster's address and the replicas' names). A failure is broadcast on ``slow`` (the
    other ranks must not wait for replicas that will never come), then raised."""
    from vagent.distributed import broadcast_object, on_group
    from vagent.models.remote import import_ray, start_ray

    ray = import_ray()
    try:
        owns = not ray.is_initialized()
        start_ray()
        names = [f"engine-{cfg.seed}-{os.getpid()}-{i}" for i in range(cfg.rollout.replicas)]
        engine = _new_replicas(cfg, loaded, _full_model(loaded, full, fresh_model), model_dir, names)
        return engine, owns, _Pool(address=str(ray.get_runtime_context().gcs_address), names=tuple(names))
    except Exception as exc:
        with on_group(slow):
            broadcast_object(_Pool(error=f"{type(exc).__name__}: {exc}"), "engine replicas")
        raise


def _new_replicas(cfg: RunConfig, loaded: LoadedModel, model: torch.nn.Module | None, model_dir: str | Path | None,
                  names: list[str] | None = None) -> PushedEngine:
    """The ``RemoteEngine`` of ``rollout.replicas`` new actors: hf copies of ``model``, or vLLM
    engines on ``model_dir``; each requires ``rollout.replica_resources`` (Ray custom resources,
    which pin the replicas to the nodes started with them)."""
    import torch

    from vagent.models.remote import RemoteEngine

    settings = cfg.rollout
    push_s, generate_s = settings.push_timeout_s, settings.generate_timeout_s
    pinned = dict(settings.replica_resources)  # Ray custom resources: the replicas' hosts
    if settings.engine == "vllm":
        # CUDA: one GPU per replica from Ray (it sets CUDA_VISIBLE_DEVICES); vLLM's CPU build: none
        return RemoteEngine.vllm(saved_model_dir(model_dir), loaded.encoder, replicas=settings.replicas, names=names,
                                 num_gpus=1 if torch.cuda.is_available() else 0, push_timeout_s=push_s,
                                 generate_timeout_s=generate_s, resources=pinned, interrupt=settings.interrupt,
                                 **vllm_settings(cfg, loaded))
    dtype = None if settings.engine_dtype == "auto" else getattr(torch, settings.engine_dtype)
    return RemoteEngine(model, loaded.encoder, replicas=settings.replicas, prefix_cache=settings.prefix_cache,
                        threads=settings.replica_threads, names=names, dtype=dtype, push_timeout_s=push_s,
                        generate_timeout_s=generate_s, resources=pinned, interrupt=settings.interrupt)


def _full_model(loaded: LoadedModel, full: dict[str, torch.Tensor] | None,
                fresh_model: FreshModel | None) -> torch.nn.Module | None:
    """The policy with its full weights on rank 0 (a sharded one: ``fresh_model()`` loaded with the
    gathered ``full`` state); None where the replicas do not copy it (vllm)."""
    from vagent.distributed import root_of

    if full is None:
        return None
    if root_of(loaded.model) is None:
        return loaded.model
    if fresh_model is None:
        raise ValueError("engine replicas of a sharded policy need fresh_model (an unsharded copy)")
    model = fresh_model()
    model.load_state_dict({k: v.to(next(model.parameters()).device) for k, v in full.items()})
    return model


def merge_lora_into_state(state: dict[str, torch.Tensor], model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A LoRA policy's full state dict (base-model names, as ``_base_model_keys`` gives) as the base
    checkpoint's: each adapted ``<m>.base_layer.weight`` becomes ``<m>.weight`` = W + scale * B @ A
    (PEFT's merge; scale = lora_alpha / r, or / sqrt(r) with rslora), the adapter tensors dropped.
    A state dict without LoRA tensors is returned unchanged."""
    import math

    from vagent.models.forward import unwrap

    if not any("lora_" in k for k in state):
        return state
    lora = getattr(unwrap(model), "peft_config", {}).get("default")
    if lora is None:
        raise ValueError("the gathered weights hold LoRA tensors but the policy has no PEFT 'default' adapter config")
    scale = lora.lora_alpha / (math.sqrt(lora.r) if getattr(lora, "use_rslora", False) else lora.r)
    out = {}
    for name, w in state.items():
        if "lora_" in name:
            continue
        if name.endswith(".base_layer.weight"):
            stem = name[: -len(".base_layer.weight")]
            a, b = state.get(f"{stem}.lora_A.default.weight"), state.get(f"{stem}.lora_B.default.weight")
            if a is not None and b is not None:
                w = (w.float() + scale * (b.float() @ a.float())).to(w.dtype)
        out[name.replace(".base_layer.", ".")] = w
    return out


def _base_model_keys(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A PEFT wrapper's state dict under the base model's names (what a replica holds: the
    unwrapped model with its LoRA layers in place); other state dicts unchanged."""
    prefix = "base_model.model."
    if state and all(k.startswith(prefix) for k in state):
        return {k[len(prefix):]: v for k, v in state.items()}
    return state


__all__ = ["PushedEngine", "FreshModel", "STARTUP_TIMEOUT_S", "engine_replicas", "merge_lora_into_state",
           "push_weights", "saved_model_dir", "vllm_settings"]
