"""Where a run's training rollouts are generated, and when: ``RolloutDriver``.

The RL recipes ask the driver for step ``k``'s episodes (``driver.get(k)``); the run config's
``rollout`` section decides what happens:

- ``engine: hf, replicas: 0, schedule: lockstep, overlap: 0`` (the default): the recipe's own
  in-process ``HFPolicy``, exactly as before (the driver only calls the recipe's rollout).
- ``schedule: async``: trajectories advance on their own (``vagent.rollout.async_loop``); an
  in-process model gets a ``BatchingEngine`` in front, and requests carry their own seeds.
- ``replicas: N`` (N >= 1): a ``RemoteEngine`` with N engine replicas as Ray actors (a local
  cluster is started when none is running; ``ray.shutdown()`` at ``close()``): ``HFEngine`` copies
  of the policy (``engine: hf``) or ``VLLMEngine`` s on the run's model directory (``engine:
  vllm``). Before each rollout the trainer's weights are pushed to every replica when they
  changed, versioned by the step.
- ``engine: vllm, replicas: 0``: a ``VLLMEngine`` in the training process (on its GPU, or on the
  CPU with vLLM's CPU build); the trainer's weights are pushed into it before each rollout, and a
  colocated GPU engine frees its KV cache while the trainer updates.
- A job of several ranks (``vagent train --nproc N``): the ranks gather the full weights of the
  sharded policy and rank 0 alone pushes them to the replicas, which every rank shares; so a job
  with ``engine: vllm`` needs ``replicas >= 1`` (one in-process engine per rank is not built).
- ``overlap: 1``: right after step ``k``'s episodes are taken, step ``k+1``'s rollout starts in a
  background thread on the generator's weights at that moment (the trainer's after ``k``
  updates) while step ``k`` updates: bounded staleness 1. Step ``k+1`` then trains on episodes
  one update old; the recipes take the PPO ratio against their sampling-time (behaviour)
  log-probs. Needs a generator apart from the trainer's model (replicas >= 1 or vllm). In a job
  of several ranks the background rollout gathers the ranks' episodes on a process group of its
  own (``vagent.distributed.side_group``), so its collectives never meet the update's.

The recipe's rollout is called as ``run(policy, step, unshard)``: ``unshard`` is True when the
policy generates with the trainer's own model (a sharded model is then gathered once for the
rollout, ``vagent.distributed.generation_mode``) and False when a separate generator does (engine
replicas, vLLM), whose rollout must not touch the trainer's parameters.

Every step's metrics gain, where the engine records versions, ``rollout/weights_version`` (the
oldest weights version that sampled a turn) and ``rollout/weights_lag`` (trainer version minus
that: 0 without overlap, 1 with it). Every turn must carry the version pushed before its rollout
started: a turn sampled with other weights (a push that did not reach the generator) is an error,
not a silent off-policy batch. Validation keeps using the recipe's in-process policy (the
trainer's current weights).

``env_factory_for(entry)``: envs of a config entry with ``urls`` live on ``vagent serve-env``
servers (``RemoteEnv``: failover over the urls, replay on server loss); one connection pool per
entry for the whole run.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

logger = logging.getLogger(__name__)

_FACTORIES: dict[tuple, Callable[[], Any]] = {}
_FACTORIES_LOCK = threading.Lock()


def env_factory_for(entry: Any) -> Callable[[], Any] | None:
    """A zero-argument factory of ``RemoteEnv`` on ``entry.urls`` with ``entry.token`` (None for an
    in-process entry).

    Cached per (urls, name, config, token): one connection pool per config entry for the run.
    """
    urls = list(getattr(entry, "urls", None) or [])
    if not urls:
        return None
    token = getattr(entry, "token", None)  # None: $VAGENT_SERVICE_TOKEN (vagent.service.client.service_token)
    key = (tuple(urls), entry.name, json.dumps(entry.config, sort_keys=True, default=str), token)
    with _FACTORIES_LOCK:
        if key not in _FACTORIES:
            from vagent.service.batch import remote_env_factory

            _FACTORIES[key] = remote_env_factory(urls, entry.name, token, **dict(entry.config))
        return _FACTORIES[key]


def check_rollout_setup(r: Any, distributed: bool) -> None:
    """Refuse, before anything is built, rollout settings this process cannot run: engine replicas
    without Ray installed, vLLM without vLLM, an in-process vLLM in a job of several ranks."""
    import importlib.util

    from vagent.config import ConfigError

    if distributed and r.engine == "vllm" and r.replicas == 0:
        raise ConfigError("rollout.engine vllm in a job of several ranks runs as Ray actor replicas that every rank "
                          "shares (rank 0 pushes the gathered weights): set rollout.replicas N >= 1, or run one "
                          "process (vLLM in the training process).")
    if r.replicas >= 1 and importlib.util.find_spec("ray") is None:
        raise ConfigError("rollout.replicas >= 1 runs engine replicas as Ray actors, and Ray is not installed: "
                         "pip install 'vagent[ray]' (or set rollout.replicas 0 to generate in the training process).")
    if r.engine == "vllm" and importlib.util.find_spec("vllm") is None:
        from vagent.models.vllm_engine import VLLM_HINT

        raise ConfigError(f"rollout.engine vllm needs vLLM, which is not installed: {VLLM_HINT}; or set "
                          "rollout.engine hf.")


def is_default(r: Any) -> bool:
    """Whether the rollout settings are the in-process, lockstep, overlap-free default."""
    return r.engine == "hf" and r.replicas == 0 and r.schedule == "lockstep" and r.overlap == 0


class RolloutDriver:
    """Step ``k``'s training episodes from the configured generator (see the module docstring).

    Args:
        run: ``(policy, step, unshard) -> RolloutResult``, the recipe's rollout of one step (see the
            module docstring for ``unshard``).
        policy: the policy to roll out with (the recipe's own one on the default path).
        engine: the generator whose weights are pushed (``update_weights(model, version)``), or None.
        model: the trainer's model (pushed to ``engine``).
        overlap: 0, or 1 to roll out step k+1 while step k updates.
        steps: the run's last step + 1 (no rollout is started beyond it).
        owns_ray: ``close()`` shuts the Ray cluster down (the driver started it).
    """

    def __init__(self, run: Callable[[Any, int, bool], Any], policy: Any, *, engine: Any = None, model: Any = None,
                 overlap: int = 0, steps: int = 0, owns_ray: bool = False):
        if overlap not in (0, 1):
            raise ValueError(f"overlap must be 0 or 1, got {overlap}")
        if overlap and engine is None:
            raise ValueError("overlap 1 needs a generator apart from the trainer's model (engine replicas or vLLM)")
        self.run, self.policy, self.engine, self.model = run, policy, engine, model
        self.overlap, self.steps, self.owns_ray = overlap, steps, owns_ray
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vagent-overlap") if overlap else None
        self._pending: tuple[int, Future, int] | None = None  # (step, its rollout, weights version)
        # the background rollout's collectives (a job's episode gather) run on a group of their own
        self._group = None
        if overlap:
            from vagent.distributed import side_group

            self._group = side_group("overlapped rollout")

    @property
    def unshard(self) -> bool:
        """Whether the rollout generates with the trainer's own model (no separate generator)."""
        return self.engine is None

    def _run_beside(self, step: int) -> Any:
        """The recipe's rollout of ``step`` in the background thread, on the driver's own group."""
        from vagent.distributed import on_group

        with on_group(self._group):
            return self.run(self.policy, step, self.unshard)

    def _push(self, version: int) -> None:
        if self.engine is not None and self.engine.weights_version != version:
            push_weights(self.engine, self.model, version)

    def get(self, step: int) -> Any:
        """Step ``step``'s episodes (started in the background during the previous step when overlapping)."""
        if self._pending is not None and self._pending[0] == step:
            episodes = self._pending[1].result()
            version = self._pending[2]
            self._pending = None
        else:
            self._push(step)  # the trainer has made `step` updates
            version = step
            episodes = self.run(self.policy, step, self.unshard)
        if self._pool is not None and step + 1 < self.steps:
            self._push(step)
            self._pending = (step + 1, self._pool.submit(self._run_beside, step + 1), step)
        elif getattr(self.engine, "sleep", None) is not None:
            self.engine.sleep()  # a colocated vLLM frees its KV cache while the trainer updates
        self._annotate(episodes, step, version if self.engine is not None else None)
        return episodes

    def _annotate(self, episodes: Any, step: int, pushed: int | None) -> None:
        """``rollout/weights_version`` and ``rollout/weights_lag``; with a generator of its own
        (``pushed``: the version pushed before the rollout), every turn must carry that version."""
        versions = [t.weights_version for e in episodes for t in e.turns if t.weights_version is not None]
        if pushed is not None:
            stale = sorted({v for v in versions if v != pushed})
            missing = sum(t.weights_version is None for e in episodes for t in e.turns)
            if stale or missing:
                raise RuntimeError(
                    f"step {step}'s rollout should have been sampled with weights version {pushed} (pushed before "
                    f"it started), but {type(self.engine).__name__} stamped turns with versions {stale}"
                    f"{f' and {missing} turn(s) with none' if missing else ''}: the weight push did not reach "
                    "the generator, so the batch is off-policy. Report this with the run's train.log.")
        if versions and hasattr(episodes, "metrics"):
            episodes.metrics["rollout/weights_version"] = float(min(versions))
            episodes.metrics["rollout/weights_lag"] = float(step - min(versions))

    def close(self) -> None:
        """Wait for a background rollout, stop the generator (and Ray when the driver started it)."""
        if self._pending is not None:
            try:
                self._pending[1].result()
            except Exception as exc:  # noqa: BLE001 -- the run is ending; the rollout is not used
                logger.warning("the overlapped rollout of step %d failed: %s", self._pending[0], exc)
            self._pending = None
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        front = getattr(self.policy, "engine", None)
        for obj in ([front] if front is not self.engine else []) + [self.engine]:
            close = getattr(obj, "close", None)
            if close is not None:
                close()
        if self.owns_ray:
            import ray

            ray.shutdown()


def push_weights(engine: Any, model: Any, version: int) -> None:
    """Send the trainer's weights to ``engine`` as ``version``. One process: ``update_weights``. A job
    of several ranks with a sharded policy: every rank takes part in gathering the full weights,
    rank 0 pushes them to the shared replicas (``update_state``), and no rank goes on before the
    push is done."""
    from vagent.distributed import barrier, full_state_dict, root_of, world

    w = world()
    if not w.distributed or root_of(model) is None:
        engine.update_weights(model, version)
        return
    full = full_state_dict(model, to_all_ranks=False)
    if w.rank == 0:
        state = _base_model_keys(full)
        if getattr(engine, "takes_merged_weights", False):  # vLLM: LoRA merged into the base weights
            state = merge_lora_into_state(state, model)
        engine.update_state(state, version)
    else:
        engine.weights_version = version
    barrier("engine weights pushed")


def make_driver(cfg: Any, loaded: Any, policy: Any, run: Callable[[Any, int, bool], Any], model_dir: Any = None,
                fresh_model: Callable[[], Any] | None = None) -> RolloutDriver:
    """The driver of a run config's ``rollout`` section; ``policy`` is the recipe's in-process
    ``HFPolicy`` (used as it is on the default path). ``fresh_model()``: an unsharded copy of the
    policy (``Session.load_fresh_model``), needed by engine replicas in a job of several ranks."""
    from vagent.rollout.hf_policy import HFPolicy

    r = cfg.rollout
    if is_default(r):
        return RolloutDriver(run, policy, steps=cfg.steps)
    owns_ray, engine = False, None
    ctx = cfg.model.max_context_tokens  # model.max_context_tokens: a turn beyond it ends the episode
    if r.replicas >= 1:
        engine, owns_ray = engine_replicas(cfg, loaded, fresh_model, model_dir)
        gen_policy = HFPolicy(engine, per_request_seeds=True, max_context_tokens=ctx)
    elif r.engine == "vllm":
        from vagent.models.vllm_engine import VLLMEngine

        engine = VLLMEngine(_model_dir(model_dir), loaded.encoder, colocate=True, **vllm_settings(cfg, loaded))
        if r.schedule == "async":
            from vagent.models.batching import BatchingEngine

            gen_policy = HFPolicy(BatchingEngine(engine), per_request_seeds=True, max_context_tokens=ctx)
        else:
            gen_policy = HFPolicy(engine, per_request_seeds=True, max_context_tokens=ctx)
    else:  # in process, asynchronous
        gen_policy = HFPolicy(loaded, prefix_cache=r.prefix_cache, per_request_seeds=True, batching=True,
                              max_context_tokens=ctx)
    if r.engine == "vllm":  # vLLM loaded model_dir, which may predate SFT: the trainer's weights, version 0
        push_weights(engine, loaded.model, 0)
    return RolloutDriver(run, gen_policy, engine=engine, model=loaded.model, overlap=r.overlap, steps=cfg.steps,
                         owns_ray=owns_ray)


def vllm_settings(cfg: Any, loaded: Any) -> dict:
    """``VLLMEngine`` keyword arguments of a run config: its memory share, seed, the trainer's
    parameter dtype (so that greedy replies equal the trainer's) and the context length."""
    import torch

    dtype = next(loaded.model.parameters()).dtype
    out = {"gpu_memory_utilization": cfg.rollout.vllm_gpu_memory, "seed": cfg.seed,
           "dtype": {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}[dtype]}
    if cfg.model.max_context_tokens:
        out["max_model_len"] = cfg.model.max_context_tokens
    return out


def _model_dir(model_dir: Any) -> Any:
    if model_dir is None:
        raise ValueError("rollout.engine vllm needs the policy saved on disk (the run's model directory)")
    return model_dir


#: seconds the ranks of a job wait for each other while the replicas start (Ray start with retries,
#: actor creation, joining): at least this, or the job's dist.timeout_s when longer
STARTUP_TIMEOUT_S = 1800.0


def engine_replicas(cfg: Any, loaded: Any, fresh_model: Callable[[], Any] | None = None,
                    model_dir: Any = None) -> tuple[Any, bool]:
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
    engine, owns, info = None, False, None
    if w.rank == 0:
        try:
            owns = not ray.is_initialized()
            start_ray()
            names = [f"engine-{cfg.seed}-{os.getpid()}-{i}" for i in range(cfg.rollout.replicas)]
            engine = _new_replicas(cfg, loaded, _full_model(loaded, full, fresh_model), model_dir, names)
            info = {"address": ray.get_runtime_context().gcs_address, "names": names}
        except Exception as exc:  # the other ranks must not wait for replicas that will never come
            info = {"error": f"{type(exc).__name__}: {exc}"}
            with on_group(slow):
                broadcast_object(info, "engine replicas")
            raise
    with on_group(slow):
        info = broadcast_object(info, "engine replicas")
    if "error" in info:
        raise RuntimeError(f"rank 0 could not start the engine replicas: {info['error']}")
    if w.rank != 0:
        owns = join_ray(info["address"])
        engine = RemoteEngine.attach(info["names"], loaded.encoder)
    with on_group(slow):
        barrier("engine replicas attached")
    return engine, owns


def _new_replicas(cfg: Any, loaded: Any, model: Any, model_dir: Any, names: list[str] | None = None) -> Any:
    """The ``RemoteEngine`` of ``rollout.replicas`` new actors: hf copies of ``model``, or vLLM
    engines on ``model_dir``."""
    from vagent.models.remote import RemoteEngine

    r = cfg.rollout
    if r.engine == "vllm":
        import torch

        # CUDA: one GPU per replica from Ray (it sets CUDA_VISIBLE_DEVICES); vLLM's CPU build: none
        return RemoteEngine.vllm(_model_dir(model_dir), loaded.encoder, replicas=r.replicas, names=names,
                                 num_gpus=1 if torch.cuda.is_available() else 0, **vllm_settings(cfg, loaded))
    return RemoteEngine(model, loaded.encoder, replicas=r.replicas, prefix_cache=r.prefix_cache,
                        threads=r.replica_threads, names=names)


def _full_model(loaded: Any, full: dict | None, fresh_model: Callable[[], Any] | None) -> Any:
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


def merge_lora_into_state(state: dict, model: Any) -> dict:
    """A LoRA policy's full state dict (base-model names, as ``_base_model_keys`` gives) as the base
    checkpoint's: each adapted ``<m>.base_layer.weight`` becomes ``<m>.weight`` = W + scale * B @ A
    (PEFT's merge; scale = lora_alpha / r, or / sqrt(r) with rslora), the adapter tensors dropped.
    A state dict without LoRA tensors is returned unchanged."""
    import math

    from vagent.models.forward import unwrap

    if not any("lora_" in k for k in state):
        return state
    cfg = getattr(unwrap(model), "peft_config", {}).get("default")
    if cfg is None:
        raise ValueError("the gathered weights hold LoRA tensors but the policy has no PEFT 'default' adapter config")
    scale = cfg.lora_alpha / (math.sqrt(cfg.r) if getattr(cfg, "use_rslora", False) else cfg.r)
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


def _base_model_keys(state: dict) -> dict:
    """A PEFT wrapper's state dict under the base model's names (what a replica holds: the
    unwrapped model with its LoRA layers in place); other state dicts unchanged."""
    prefix = "base_model.model."
    if state and all(k.startswith(prefix) for k in state):
        return {k[len(prefix):]: v for k, v in state.items()}
    return state


__all__ = ["RolloutDriver", "make_driver", "check_rollout_setup", "engine_replicas", "env_factory_for", "is_default",
           "merge_lora_into_state", "push_weights", "vllm_settings"]
