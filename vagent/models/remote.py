"""``RemoteEngine``: engine replicas as Ray actors, behind the ``Engine`` protocol.

Each replica is a Ray actor holding its own copy of the policy and a ``BatchingEngine`` over an
``HFEngine`` (or vLLM); the actors' bodies are in ``vagent.models.replica_actors``. The rollout's
``HFPolicy`` calls ``RemoteEngine`` instead of an in-process engine: token ids and pixels in,
``GenerationOutput`` out; the policy keeps the conversations.

Routing (``generate``; the routing state is a :class:`~vagent.models.replica_routing.ReplicaTable`):

- a request with a ``key`` (the rollout sets the trajectory id) goes to the replica that served
  that key before, so a trajectory's turns meet their own KV cache (prefix reuse);
- a new key, or no key, goes to the live replica with the fewest outstanding requests (counted
  over all threads calling ``generate``, so concurrent asynchronous trajectories spread out);
- when a replica dies (its actor process exits; ``ray.kill`` in the tests) its requests are sent
  again to the other replicas, its keys move with them, a warning is logged, and
  ``stats["retried_requests"]`` / ``stats["dead_replicas"]`` count it (the rollout reports them as
  ``rollout/engine_retries``). Only when every replica is dead does ``generate`` raise.

Deadlines: no call to a replica waits forever. A replica that is alive but stuck (a blocked
``load_weights`` or ``generate``, a cut link) is one that has not answered a weight push within
``push_timeout_s`` (``rollout.push_timeout_s``, 600 s by default; also the wait for the replicas to
start) or a generate, canary or stats call within ``generate_timeout_s``
(``rollout.generate_timeout_s``, 1800 s): it is marked dead and killed (by any process that sees
it stuck, so that it frees its resources and, after a missed push, never answers with stale
weights), and its requests go to the other replicas as a dead one's do. With no replica left, the
call raises :class:`NoReplicaLeft`, one line naming each replica's fate and the setting to raise.

Weights: ``update_weights(model)`` sends the trainer's ``state_dict`` (once, through the object
store) to every live replica and waits for all of them; each replica loads it once its running
generate calls are done (holding new ones back meanwhile, so pushes may land while other threads
generate) and stamps every later output with the new ``weights_version``
(``GenerationOutput.weights_version``, recorded on each ``Turn``): a reply's stamp is the version of
the weights that produced it. Replicas start at version 0 with the weights they were built with.

Exactness: a replica's greedy replies equal the in-process engine's, and so do sampled ones when
every request carries its own seed (``GenerationRequest.seed``, set by
``HFPolicy(per_request_seeds=True)``): batch-seeded sampling depends on which requests share a
batch, which routing changes.

Jobs of several ranks (``vagent train --nproc N``): rank 0 creates the replicas as named actors
(namespace ``vagent``) and every other rank joins rank 0's cluster and attaches to them
(``RemoteEngine.attach``), so one pool of replicas serves every rank's share of the rollout; the
ranks gather the full weights and rank 0 pushes them (``update_state``). Set ``RAY_ADDRESS`` to
use a cluster started with ``ray start`` (replicas on other hosts); ``resources`` (Ray custom
resources each replica requires, ``rollout.replica_resources``) pins the replicas to the nodes
started with them (``ray start --resources '{"vagent_replica": 2}'``).

The Ray cluster the replicas run in (``start_ray``, ``join_ray``, the actors' options) is
:mod:`vagent.models.ray_cluster`; its names are importable from here too.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Mapping, Sequence

from vagent.models.engine import GenerationOutput, GenerationRequest, SamplingParams
from vagent.models.interrupt import continue_interrupted
# the cluster the replicas run in lives beside this module; importable from here (old private names too)
from vagent.models.ray_cluster import (  # noqa: F401
    NAMESPACE, RAY_HINT, _kill_own_ray_processes, actor_resources, import_ray, join_ray, ray_session_processes,
    replica_options, running_ray, start_ray,
)
from vagent.models.ray_cluster import replica_options as _replica_options  # noqa: F401
# the actors' bodies and the push helpers live beside this module; importable from here
from vagent.models.replica_actors import (  # noqa: F401
    Deferred, EngineReplica, NoReplicaLeft, PushGate, ReplicaLost, ReplicaTimeout, VLLMReplica, adapter_names,
    check_adapter_push, pushed_state, sequence_token_logprobs,
)
from vagent.models.replica_routing import ReplicaTable

logger = logging.getLogger(__name__)

#: default seconds a weight push (and the replicas' start) may take: ``rollout.push_timeout_s``
PUSH_TIMEOUT_S = 600.0
#: default seconds a replica may take to answer a generate call: ``rollout.generate_timeout_s``
GENERATE_TIMEOUT_S = 1800.0


def _left(deadline: float) -> float:
    """Seconds from now to ``deadline`` (``time.monotonic``), at least 0 (``ray.get(timeout=0)``
    still returns a result that is ready)."""
    return max(0.0, deadline - time.monotonic())


def _dead_errors(ray: Any) -> tuple[type[BaseException], ...]:
    errs: list[type[BaseException]] = [ray.exceptions.RayActorError]
    if hasattr(ray.exceptions, "ActorUnavailableError"):
        errs.append(ray.exceptions.ActorUnavailableError)
    return tuple(errs)


class RemoteEngine:
    """``Engine`` over ``replicas`` Ray actors (see the module docstring).

    Args:
        model: the policy module to copy into each replica (moved to CPU for the copy).
        encoder: its ``ChatEncoder``.
        replicas: number of actors.
        prefix_cache: each replica's HFEngine keeps its KV cache between calls.
        threads: torch threads per replica.
        num_cpus: Ray CPUs reserved per replica (0 lets replicas share the cluster's CPUs).
        max_concurrency: calls one replica accepts at once (its batching front merges them).
        dtype: the replicas' parameter dtype (e.g. ``torch.bfloat16``); None = the model's. Pushed
            weights are cast into it as they load.
        push_timeout_s: seconds a weight push (and the replicas' start) may take, the wait for a
            replica's running generate calls included; a replica slower than that is stuck: killed,
            marked dead (``rollout.push_timeout_s``).
        generate_timeout_s: seconds a replica may take to answer a generate (or canary, or stats)
            call; a replica slower than that is stuck: killed, marked dead, its requests sent to the
            others (``rollout.generate_timeout_s``).
        resources: Ray custom resources each replica requires (``rollout.replica_resources``, e.g.
            ``{"vagent_replica": 1}``): the replicas start only on nodes that offer them.
        interrupt: a waiting push stops the running replies, continued on the new weights
            (``rollout.interrupt``, :mod:`vagent.models.interrupt`).
    """

    #: ``generate`` may be called from many threads at once
    thread_safe = True

    def __init__(self, model: Any, encoder: Any, *, replicas: int = 2, prefix_cache: bool = True,
                 threads: int = 1, num_cpus: float = 0, max_concurrency: int = 64,
                 names: Sequence[str] | None = None, dtype: Any = None, push_timeout_s: float = PUSH_TIMEOUT_S,
                 generate_timeout_s: float = GENERATE_TIMEOUT_S, resources: Mapping[str, float] | None = None,
                 interrupt: bool = False):
        named = replica_options(replicas, names, resources)
        ray = running_ray()
        actor = ray.remote(EngineReplica)
        # unpickled by each actor itself, its imports out of the garbage collector's walks (replica_actors)
        model, shared_encoder = Deferred(ref=ray.put(_cpu_copy(model, dtype))), Deferred(encoder)
        handles = [actor.options(num_cpus=num_cpus, max_concurrency=max_concurrency, **kw).remote(
            model, shared_encoder, prefix_cache, threads, interrupt=interrupt) for kw in named]
        self._setup(ray, encoder, handles, owner=True, timeouts=(push_timeout_s, generate_timeout_s),
                    resources=resources)

    @classmethod
    def attach(cls, names: Sequence[str], encoder: Any, *, push_timeout_s: float = PUSH_TIMEOUT_S,
               generate_timeout_s: float = GENERATE_TIMEOUT_S) -> "RemoteEngine":
        """A ``RemoteEngine`` over replicas another process created with ``names`` (the other ranks
        of a job use rank 0's replicas). It routes and retries like the owner (and kills a replica
        it finds stuck, so that every process sees it dead); ``close()`` leaves the replicas to
        their owner."""
        ray = running_ray()
        try:
            handles = [ray.get_actor(n, namespace=NAMESPACE) for n in names]
        except ValueError as exc:
            raise RuntimeError(f"engine replicas {list(names)} not found in the Ray cluster (the process that "
                               f"created them has exited, or this process joined another cluster): {exc}") from exc
        engine = cls.__new__(cls)
        engine._setup(ray, encoder, handles, owner=False, timeouts=(push_timeout_s, generate_timeout_s))
        return engine

    @classmethod
    def vllm(cls, model_dir: Any, encoder: Any, *, replicas: int = 2, num_cpus: float = 0, num_gpus: float = 0,
             max_concurrency: int = 64, names: Sequence[str] | None = None, push_timeout_s: float = PUSH_TIMEOUT_S,
             generate_timeout_s: float = GENERATE_TIMEOUT_S, resources: Mapping[str, float] | None = None,
             interrupt: bool = False, **engine_kwargs: Any) -> "RemoteEngine":
        """A ``RemoteEngine`` over ``replicas`` vLLM actors (``VLLMReplica``), each loading
        ``model_dir`` with ``VLLMEngine(**engine_kwargs)``; they start at the same time. ``num_gpus``:
        GPUs Ray gives each replica (1 on a GPU cluster: one vLLM per GPU; 0 for vLLM's CPU build);
        ``resources``: Ray custom resources each requires, as in the constructor; ``interrupt``: a
        waiting push stops the running replies, continued on the new weights (``rollout.interrupt``)."""
        named = replica_options(replicas, names, resources)
        ray = running_ray()
        actor = ray.remote(VLLMReplica)
        handles = [actor.options(num_cpus=num_cpus, num_gpus=num_gpus, max_concurrency=max_concurrency, **kw).remote(
            str(model_dir), Deferred(encoder), dict(engine_kwargs), interrupt=interrupt) for kw in named]
        engine = cls.__new__(cls)
        engine._setup(ray, encoder, handles, owner=True, timeouts=(push_timeout_s, generate_timeout_s),
                      resources=resources)
        engine.takes_adapters = int(engine_kwargs.get("lora_rank", 0) or 0) > 0
        return engine

    def _setup(self, ray: Any, encoder: Any, handles: list, owner: bool, timeouts: tuple[float, float],
               resources: Mapping[str, float] | None = None) -> None:
        self._ray, self.encoder, self.replicas, self.owner = ray, encoder, handles, owner
        #: the Ray custom resources each replica required (empty: none, or attached replicas)
        self.resources = actor_resources(resources)
        #: (seconds a push or the start may take, seconds a generate call may take)
        self.push_timeout_s, self.generate_timeout_s = (float(t) for t in timeouts)
        ready = self._wait_ready()
        self.pids = [int(r[0]) for r in ready]
        #: the replicas' engines take the raw images (vLLM runs its own image processor)
        self.needs_images = any(bool(r[1]) for r in ready)
        #: per replica, whether it reported that a waiting push stops its running replies (``rollout.interrupt``)
        self.interrupts = [bool(r[2]) if len(r) > 2 else False for r in ready]
        #: vLLM replicas: pushed state dicts must hold merged weights, no LoRA adapter tensors
        self.takes_merged_weights = self.needs_images
        #: vLLM replicas built with lora_rank: a LoRA policy pushes its adapter (``update_adapter``)
        self.takes_adapters = False
        #: the live replicas, each key's home, the requests outstanding (:mod:`vagent.models.replica_routing`)
        self._table = ReplicaTable(self.pids)
        self._home, self._outstanding = self._table.home, self._table.outstanding  # read by the tests
        #: trainer-side weights version: the number of ``update_weights`` pushes
        self.weights_version = 0
        #: counters since construction (``retried_requests``: sent again after their replica died)
        self.stats = self._table.stats

    def _wait_ready(self) -> list[tuple]:
        """Each replica's ``ready()``, all within ``push_timeout_s``; else (a replica still starting,
        or waiting for CPUs / GPUs / custom resources the cluster lacks) one error, after killing the
        replicas this engine created."""
        ray = self._ray
        refs = [r.ready.remote() for r in self.replicas]
        deadline = time.monotonic() + self.push_timeout_s
        out = []
        for i, ref in enumerate(refs):
            try:
                out.append(ray.get(ref, timeout=_left(deadline)))
            except ray.exceptions.GetTimeoutError:
                if self.owner:
                    for r in self.replicas:
                        ray.kill(r, no_restart=True)
                lacks, offer = "CPUs / GPUs", ""
                if self.resources:
                    wanted = ", ".join(f"{k}: {v:g}" for k, v in self.resources.items())
                    lacks += f" or the custom resources {{{wanted}}} of rollout.replica_resources"
                    offer = ("; a node offers them when started with `ray start --address HEAD:PORT --resources '{"
                             + ", ".join(f'"{k}": N' for k in self.resources) + "}'`")
                raise ReplicaTimeout(
                    f"engine replica {i} was not ready within rollout.push_timeout_s={self.push_timeout_s:g} s (still "
                    f"loading, or waiting for {lacks} the Ray cluster lacks: see `ray status`{offer}); if its start "
                    "is only slow, raise rollout.push_timeout_s") from None
        return out

    # ------------------------------------------------------------------ routing
    def _drop_stuck(self, replica: int, call: str, setting: str, timeout_s: float, n_requests: int) -> str:
        """Mark ``replica`` dead for not answering ``call`` within ``timeout_s`` (``setting``), then
        kill its actor: a stuck replica frees its resources and never answers later (with stale
        weights, after a missed push); returns the clause that says so."""
        fate = f"did not answer {call} within {setting}={timeout_s:g} s (stuck; killed)"
        self._table.mark_dead(replica, fate, n_requests)
        try:
            self._ray.kill(self.replicas[replica], no_restart=True)
        except Exception as exc:  # noqa: BLE001 -- already gone (its host lost): dead either way; logged
            logger.warning("killing stuck engine replica %d failed: %s", replica, exc)
        return f"engine replica {replica} (pid {self.pids[replica]}) {fate}"

    def generate(self, requests: Sequence[GenerationRequest], params: SamplingParams) -> list[GenerationOutput]:
        """Route, run on the replicas in parallel, retry a dead replica's requests elsewhere; replies a
        push stopped (``rollout.interrupt``) continue on the new weights (``vagent.models.interrupt``)."""
        return continue_interrupted(self._routed, requests, params, self._routed(requests, params), self.encoder)

    def _routed(self, requests: Sequence[GenerationRequest], params: SamplingParams) -> list[GenerationOutput]:
        ray = self._ray
        results: list[GenerationOutput | None] = [None] * len(requests)
        todo = list(range(len(requests)))
        self.stats["requests"] += len(requests)
        while todo:
            homes = self._table.route([requests[i] for i in todo])
            groups: dict[int, list[int]] = {}
            for i, h in zip(todo, homes):
                groups.setdefault(h, []).append(i)
            calls = {h: self.replicas[h].generate.remote([requests[i] for i in idx], params)
                     for h, idx in groups.items()}
            deadline = time.monotonic() + self.generate_timeout_s  # the calls run at once: one deadline
            todo = []
            for h, ref in calls.items():
                try:
                    outs = ray.get(ref, timeout=_left(deadline))
                except _dead_errors(ray) as exc:
                    self._table.mark_dead(h, f"died ({type(exc).__name__})", len(groups[h]))
                    todo += groups[h]
                    continue
                except ray.exceptions.GetTimeoutError:
                    self._drop_stuck(h, "generate", "rollout.generate_timeout_s", self.generate_timeout_s,
                                     len(groups[h]))
                    todo += groups[h]
                    continue
                finally:
                    self._table.release(h, len(groups[h]))
                for i, out in zip(groups[h], outs):
                    results[i] = out
            todo.sort()
        return results  # type: ignore[return-value]

    # ------------------------------------------------------------------ weights
    def update_weights(self, model: Any, version: int | None = None) -> int:
        """Push ``model``'s weights to every live replica and wait; returns the new version. A LoRA
        policy (PEFT; only adapter tensors trainable) pushes only its adapter tensors to hf replicas
        (:func:`pushed_state`: they hold the same frozen base) and to vLLM replicas built with
        ``lora_rank`` (``update_adapter``); other vLLM replicas get the adapter merged."""
        if self.takes_merged_weights:  # vLLM replicas
            if self.takes_adapters and adapter_names(model) is not None:
                return self.update_adapter(pushed_state(model), _unwrap(model).peft_config["default"].to_dict(), version)
            from vagent.models.vllm_weights import weights_to_push

            return self.update_state({k: v.detach().to("cpu") for k, v in weights_to_push(model)}, version)
        return self.update_state(pushed_state(model), version)

    def update_adapter(self, state: dict, lora_config: dict, version: int | None = None) -> int:
        """Push a LoRA adapter (``lora_`` tensors under base-model names, its PEFT config as a dict) to
        every live vLLM replica, which serves it beside its base weights; returns the new version."""
        return self._broadcast("load_adapter", version, ray_args=(state, dict(lora_config)))

    def update_state(self, state: dict, version: int | None = None) -> int:
        """Push a full (unsharded, CPU) state dict to every live replica and wait; returns the new
        version. A sharded trainer gathers it first (``vagent.distributed.full_state_dict``)."""
        return self._broadcast("load_weights", version, ray_args=(state,))

    def _broadcast(self, method: str, version: int | None, ray_args: tuple) -> int:
        """Call ``method(*ray_args, version)`` on every live replica (the arguments put in the object
        store once), wait up to ``push_timeout_s`` in all, mark the dead and kill the stuck (a replica
        with stale weights must not generate again); returns the new version."""
        ray = self._ray
        version = self.weights_version + 1 if version is None else int(version)
        refs_in = [ray.put(a) for a in ray_args]
        live = self._table.live()
        refs = {i: getattr(self.replicas[i], method).remote(*refs_in, version) for i in live}
        deadline = time.monotonic() + self.push_timeout_s  # the pushes run at once: one deadline
        for i, ref in refs.items():
            try:
                ray.get(ref, timeout=_left(deadline))
            except _dead_errors(ray) as exc:
                self._table.mark_dead(i, f"died ({type(exc).__name__}) during the weight push", 0)
            except ray.exceptions.GetTimeoutError:
                self._drop_stuck(i, f"the weight push ({method})", "rollout.push_timeout_s", self.push_timeout_s, 0)
        if not any(self._table.alive):
            raise NoReplicaLeft(self._table.none_left(f"the weight push of version {version} reached none"))
        self.weights_version = version
        return version

    def generate_on(self, replica: int, requests: Sequence[GenerationRequest],
                    params: SamplingParams) -> list[GenerationOutput]:
        """``generate`` on replica ``replica`` only, without routing or retries (the weight canary
        checks every replica after a push). A replica silent for ``generate_timeout_s`` is killed and
        the call raises TimeoutError."""
        return self._answer(replica, self.replicas[replica].generate.remote(list(requests), params), "generate")

    def replica_logprobs(self, replica: int, input_ids: list[int], n_prompt: int,
                         temperature: float = 1.0) -> list[float]:
        """A replica's log-probs of ``input_ids[n_prompt:]`` given the rest (weight checks); within
        ``generate_timeout_s`` or a TimeoutError, as ``generate_on``."""
        ref = self.replicas[replica].logprobs.remote(list(input_ids), n_prompt, temperature)
        return self._answer(replica, ref, "logprobs")

    def replica_stats(self) -> list[dict | None]:
        """Each replica's counters (None for a dead one); within ``generate_timeout_s`` each, or a
        TimeoutError, as ``generate_on``."""
        refs = {i: r.stats.remote() for i, r in enumerate(self.replicas) if self._table.alive[i]}
        return [self._answer(i, refs[i], "stats") if i in refs else None for i in range(len(self.replicas))]

    def _answer(self, replica: int, ref: Any, call: str) -> Any:
        """``ray.get(ref)`` of one replica's ``call``, within ``generate_timeout_s``; else the replica
        is killed and marked dead, and one TimeoutError line says so (no other replica answers in its
        place: these calls ask that replica)."""
        try:
            return self._ray.get(ref, timeout=self.generate_timeout_s)
        except self._ray.exceptions.GetTimeoutError:
            why = self._drop_stuck(replica, call, "rollout.generate_timeout_s", self.generate_timeout_s, 0)
            raise ReplicaTimeout(f"{why}; if it is only slow, raise rollout.generate_timeout_s (seconds; "
                                 "docs/distributed.md, 'Timeouts of remote calls')") from None
        except _dead_errors(self._ray) as exc:
            self._table.mark_dead(replica, f"died ({type(exc).__name__}) during {call}", 0)
            raise ReplicaLost(f"engine replica {replica} (pid {self.pids[replica]}) died during {call}: "
                              f"{type(exc).__name__}") from None

    @property
    def alive(self) -> list[bool]:
        return list(self._table.alive)

    def kill_replica(self, replica: int) -> None:
        """Kill a replica's actor (failure drills and tests); routing notices on its next call."""
        self._ray.kill(self.replicas[replica], no_restart=True)

    def close(self, shutdown: bool = False) -> None:
        """Kill the replicas this engine created (an attached one leaves them to their owner), and
        ``ray.shutdown()`` when ``shutdown``."""
        for i, r in enumerate(self.replicas):
            if self._table.alive[i] and self.owner:
                try:
                    self._ray.kill(r, no_restart=True)
                except Exception as exc:  # noqa: BLE001 -- closing must go on; logged
                    logger.warning("killing engine replica %d failed: %s", i, exc)
            self._table.alive[i] = False
        if shutdown:
            self._ray.shutdown()


def _unwrap(model: Any) -> Any:
    from vagent.models.forward import unwrap

    return unwrap(model)


def _cpu_copy(model: Any, dtype: Any = None) -> Any:
    """A CPU copy of the (unwrapped) model in eval mode, in the trainer's dtype (or ``dtype``)."""
    import copy

    out = copy.deepcopy(_unwrap(model)).to("cpu").eval()
    return out if dtype is None else out.to(dtype)


__all__ = ["RemoteEngine", "NoReplicaLeft", "ReplicaLost", "ReplicaTimeout", "EngineReplica", "VLLMReplica", "PushGate", "start_ray", "join_ray", "import_ray",
           "sequence_token_logprobs", "RAY_HINT", "adapter_names", "check_adapter_push", "pushed_state", "PUSH_TIMEOUT_S",
           "GENERATE_TIMEOUT_S"]
