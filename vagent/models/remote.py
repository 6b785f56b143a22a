"""``RemoteEngine``: engine replicas as Ray actors, behind the ``Engine`` protocol.

Each replica is a Ray actor holding its own copy of the policy and a ``BatchingEngine`` over an
``HFEngine`` (or vLLM); the actors' bodies are in ``vagent.models.replica_actors``. The rollout's
``HFPolicy`` calls ``RemoteEngine`` instead of an in-process engine: token ids and pixels in,
``GenerationOutput`` out; the policy keeps the conversations.

Routing (``generate``):

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

Ray is an optional extra (``pip install 'vagent[ray]'``), imported when a ``RemoteEngine`` is built.
``start_ray`` starts a small local cluster with settings measured on a 2-core machine (256 MB
object store, no dashboard, token auth off for a loopback cluster).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any, Mapping, Sequence

from vagent.models.engine import GenerationOutput, GenerationRequest, SamplingParams
from vagent.models.interrupt import continue_interrupted
# the actors' bodies and the push helpers live beside this module; importable from here
from vagent.models.replica_actors import (  # noqa: F401
    EngineReplica, NoReplicaLeft, PushGate, ReplicaLost, VLLMReplica, adapter_names, check_adapter_push, pushed_state,
    token_logprobs,
)

logger = logging.getLogger(__name__)

RAY_HINT = "pip install 'vagent[ray]'"
#: Ray namespace of named replicas (shared by the ranks of a job)
NAMESPACE = "vagent"
#: default seconds a weight push (and the replicas' start) may take: ``rollout.push_timeout_s``
PUSH_TIMEOUT_S = 600.0
#: default seconds a replica may take to answer a generate call: ``rollout.generate_timeout_s``
GENERATE_TIMEOUT_S = 1800.0


def import_ray() -> Any:
    """``import ray``, or an ImportError naming the pip install that fixes it."""
    try:
        import ray
    except ImportError as exc:
        raise ImportError(f"engine replicas run as Ray actors, and Ray is not installed: {RAY_HINT} "
                          "(or set rollout.replicas: 0 to generate in the training process)") from exc
    return ray


def start_ray(num_cpus: int | None = None, object_store_mb: int = 256, *, num_gpus: int | None = None,
              tries: int = 5, **kwargs: Any) -> Any:
    """Start (or join, when already started) a local Ray cluster; returns the ``ray`` module.

    Token auth is turned off (``RAY_AUTH_MODE=disabled``) unless the caller set it: the cluster
    listens on loopback only and Ray 2.60 would otherwise write a token file. On a busy machine
    Ray's raylet may not register within Ray's fixed 30 s: the start is then tried again (``tries``
    times in all), after killing the failed attempt's processes. Call ``ray.shutdown()`` when done
    (``RemoteEngine.close(shutdown=True)`` does).

    No Ray process outlives this process (:mod:`vagent.models.ray_reaper`): a started cluster's
    session folder is marked with this driver, a watchdog process kills what is left of it when
    this process ends (a SIGKILL included), and every start first kills the leftovers of marked
    sessions whose driver has ended (the crashed run a resume follows).
    """
    ray = import_ray()
    if ray.is_initialized():
        return ray
    if os.environ.get("RAY_ADDRESS"):  # a cluster the user started (`ray start --head` on several hosts)
        join_ray(os.environ["RAY_ADDRESS"])
        return ray
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    _reap_and_watch(kwargs.get("_temp_dir"))
    from vagent.omp import without_own_wait_settings

    for attempt in range(1, tries + 1):
        try:
            with without_own_wait_settings():  # the cluster's workers inherit none; each replica decides
                ray.init(num_cpus=num_cpus, num_gpus=num_gpus, include_dashboard=False,
                         object_store_memory=object_store_mb * 2**20, log_to_driver=False, configure_logging=False,
                         **kwargs)
            _mark_own_session()
            return ray
        except Exception as exc:  # Ray raises a bare Exception for the startup timeout
            ray.shutdown()
            _kill_own_ray_processes()  # the failed start's GCS, monitor and dashboard (ray.shutdown leaves them)
            if "timed out during startup" not in str(exc) or attempt == tries:
                raise RuntimeError(f"the local Ray cluster did not start ({exc}); on a busy machine try again when "
                                   "the load is lower, or start one yourself (`ray start --head`) and set "
                                   "RAY_ADDRESS") from exc
            logger.warning("the local Ray cluster did not start in time (attempt %d of %d); trying again",
                           attempt, tries)
    raise AssertionError("unreachable")


def ray_session_processes(driver_pid: int) -> list[Any]:
    """The live processes (``psutil.Process``) of the local Ray cluster that the process
    ``driver_pid`` started (:func:`vagent.models.ray_reaper.ray_session_processes`: Ray names the
    session folder after that driver, ``session_<time>_<pid>``; its daemons name it in their command
    lines, and every process of the cluster, the retitled ``ray::`` workers and agents too, holds
    its log files open)."""
    from vagent.models.ray_reaper import ray_session_processes as found

    return found(driver_pid)


def _reap_and_watch(temp_dir: str | None) -> None:
    """Before this process starts a local cluster: kill the leftovers of crashed drivers' marked
    sessions, and start this process's watchdog (see :mod:`vagent.models.ray_reaper`)."""
    from vagent.models.ray_reaper import reap_dead_sessions, start_watchdog

    if temp_dir is None:
        try:
            from ray._common.utils import get_default_ray_temp_dir

            temp_dir = get_default_ray_temp_dir()
        except ImportError:  # another Ray layout: /tmp/ray is Ray's default
            import tempfile

            temp_dir = os.path.join(tempfile.gettempdir(), "ray")
    sessions, n = reap_dead_sessions(temp_dir)
    if n:
        logger.warning("killed %d leftover process(es) of Ray session(s) %s, whose vagent driver ended without "
                       "stopping them (a crashed run)", n, ", ".join(sessions))
    start_watchdog()


def _mark_own_session() -> None:
    """Mark the session folder of the cluster this process just started as this driver's."""
    from vagent.models.ray_reaper import mark_session

    try:
        from ray._private import worker

        session_dir = worker._global_node.get_session_dir_path()
    except (ImportError, AttributeError):  # another Ray layout: the watchdog still covers this driver
        return
    mark_session(session_dir)


def _kill_own_ray_processes() -> None:
    """SIGKILL the processes of this process's own Ray sessions (the agents of a raylet that
    crashed are orphans by then, so children() alone misses them)."""
    import psutil

    for proc in ray_session_processes(os.getpid()):
        try:
            proc.kill()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue


def join_ray(address: str) -> bool:
    """Connect this process to the running Ray cluster at ``address`` (another rank's, or the one in
    ``RAY_ADDRESS``); returns whether it connected now (False: it already was)."""
    ray = import_ray()
    if ray.is_initialized():
        return False
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    try:
        ray.init(address=address, log_to_driver=False, configure_logging=False)
    except ConnectionError as exc:
        raise ConnectionError(f"could not join the Ray cluster at {address!r} ({exc}); is it running and reachable "
                              "from this host? (`ray status --address ...` there)") from exc
    return True


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
        named = _replica_options(replicas, names, resources)
        ray = _running_ray()
        actor = ray.remote(EngineReplica)
        model_ref = ray.put(_cpu_copy(model, dtype))
        handles = [actor.options(num_cpus=num_cpus, max_concurrency=max_concurrency, **kw).remote(
            model_ref, encoder, prefix_cache, threads, interrupt=interrupt) for kw in named]
        self._setup(ray, encoder, handles, owner=True, timeouts=(push_timeout_s, generate_timeout_s),
                    resources=resources)

    @classmethod
    def attach(cls, names: Sequence[str], encoder: Any, *, push_timeout_s: float = PUSH_TIMEOUT_S,
               generate_timeout_s: float = GENERATE_TIMEOUT_S) -> "RemoteEngine":
        """A ``RemoteEngine`` over replicas another process created with ``names`` (the other ranks
        of a job use rank 0's replicas). It routes and retries like the owner (and kills a replica
        it finds stuck, so that every process sees it dead); ``close()`` leaves the replicas to
        their owner."""
        ray = _running_ray()
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
             **engine_kwargs: Any) -> "RemoteEngine":
        """A ``RemoteEngine`` over ``replicas`` vLLM actors (``VLLMReplica``), each loading
        ``model_dir`` with ``VLLMEngine(**engine_kwargs)``; they start at the same time. ``num_gpus``:
        GPUs Ray gives each replica (1 on a GPU cluster: one vLLM per GPU; 0 for vLLM's CPU build);
        ``resources``: Ray custom resources each requires, as in the constructor."""
        named = _replica_options(replicas, names, resources)
        ray = _running_ray()
        actor = ray.remote(VLLMReplica)
        handles = [actor.options(num_cpus=num_cpus, num_gpus=num_gpus, max_concurrency=max_concurrency, **kw).remote(
            str(model_dir), encoder, dict(engine_kwargs)) for kw in named]
        engine = cls.__new__(cls)
        engine._setup(ray, encoder, handles, owner=True, timeouts=(push_timeout_s, generate_timeout_s),
                      resources=resources)
        engine.takes_adapters = int(engine_kwargs.get("lora_rank", 0) or 0) > 0
        return engine

    def _setup(self, ray: Any, encoder: Any, handles: list, owner: bool, timeouts: tuple[float, float],
               resources: Mapping[str, float] | None = None) -> None:
        self._ray, self.encoder, self.replicas, self.owner = ray, encoder, handles, owner
        #: the Ray custom resources each replica required (empty: none, or attached replicas)
        self.resources = _resources(resources)
        #: (seconds a push or the start may take, seconds a generate call may take)
        self.push_timeout_s, self.generate_timeout_s = (float(t) for t in timeouts)
        replicas = len(handles)
        ready = self._wait_ready()
        self.pids = [pid for pid, _ in ready]
        #: the replicas' engines take the raw images (vLLM runs its own image processor)
        self.needs_images = any(images for _, images in ready)
        #: vLLM replicas: pushed state dicts must hold merged weights, no LoRA adapter tensors
        self.takes_merged_weights = self.needs_images
        #: vLLM replicas built with lora_rank: a LoRA policy pushes its adapter (``update_adapter``)
        self.takes_adapters = False
        self._lock = threading.Lock()
        self._alive = [True] * replicas
        #: why each dead replica is dead (one clause each, for the error when none is left)
        self._fate: list[str | None] = [None] * replicas
        self._outstanding = [0] * replicas
        self._home: dict[Any, int] = {}
        #: trainer-side weights version: the number of ``update_weights`` pushes
        self.weights_version = 0
        #: counters since construction (``retried_requests``: sent again after their replica died)
        self.stats = {"requests": 0, "retried_requests": 0, "dead_replicas": 0}

    def _wait_ready(self) -> list[tuple[int, bool]]:
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
                raise TimeoutError(
                    f"engine replica {i} was not ready within rollout.push_timeout_s={self.push_timeout_s:g} s (still "
                    f"loading, or waiting for {lacks} the Ray cluster lacks: see `ray status`{offer}); if its start "
                    "is only slow, raise rollout.push_timeout_s") from None
        return out

    # ------------------------------------------------------------------ routing
    def _route(self, requests: Sequence[GenerationRequest]) -> list[int]:
        """A live replica per request (key affinity, else fewest outstanding); counts them outstanding."""
        with self._lock:
            live = [i for i, ok in enumerate(self._alive) if ok]
            if not live:
                raise NoReplicaLeft(self._none_left("the rollout cannot continue"))
            chosen = []
            for r in requests:
                home = self._home.get(r.key) if r.key is not None else None
                if home is None or not self._alive[home]:
                    home = min(live, key=lambda i: (self._outstanding[i], i))
                    if r.key is not None:
                        self._home[r.key] = home
                self._outstanding[home] += 1
                chosen.append(home)
            return chosen

    def _release(self, replica: int, n: int) -> None:
        with self._lock:
            self._outstanding[replica] -= n

    def _mark_dead(self, replica: int, fate: str, n_requests: int) -> None:
        """Route nothing more to ``replica``; ``fate``: what happened to it (a clause, logged)."""
        with self._lock:
            if self._alive[replica]:
                self._alive[replica] = False
                self._fate[replica] = fate
                self.stats["dead_replicas"] += 1
            self.stats["retried_requests"] += n_requests
        logger.warning("engine replica %d (pid %s) %s; sending its %d request(s) to the other replicas",
                       replica, self.pids[replica], fate, n_requests)

    def _drop_stuck(self, replica: int, call: str, setting: str, timeout_s: float, n_requests: int) -> str:
        """Mark ``replica`` dead for not answering ``call`` within ``timeout_s`` (``setting``), then
        kill its actor: a stuck replica frees its resources and never answers later (with stale
        weights, after a missed push); returns the clause that says so."""
        fate = f"did not answer {call} within {setting}={timeout_s:g} s (stuck; killed)"
        self._mark_dead(replica, fate, n_requests)
        try:
            self._ray.kill(self.replicas[replica], no_restart=True)
        except Exception as exc:  # noqa: BLE001 -- already gone (its host lost): dead either way; logged
            logger.warning("killing stuck engine replica %d failed: %s", replica, exc)
        return f"engine replica {replica} (pid {self.pids[replica]}) {fate}"

    def _none_left(self, what: str) -> str:
        """The one-line error when no replica is left: each replica's fate and the timeouts to raise."""
        fates = "; ".join(f"replica {i} {f or 'died'}" for i, f in enumerate(self._fate))
        slow = sorted({s for s in ("rollout.push_timeout_s", "rollout.generate_timeout_s")
                       if any(s in (f or "") for f in self._fate)})
        hint = (f" If the replicas were only slow (a large push on a slow link, a long generate on a slow "
                f"machine), raise {' / '.join(slow)} (seconds; docs/distributed.md, 'Timeouts of remote calls')."
                if slow else "")
        return f"every engine replica is dead ({fates}); {what}.{hint}"

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
            homes = self._route([requests[i] for i in todo])
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
                    self._mark_dead(h, f"died ({type(exc).__name__})", len(groups[h]))
                    todo += groups[h]
                    continue
                except ray.exceptions.GetTimeoutError:
                    self._drop_stuck(h, "generate", "rollout.generate_timeout_s", self.generate_timeout_s,
                                     len(groups[h]))
                    todo += groups[h]
                    continue
                finally:
                    self._release(h, len(groups[h]))
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
        live = [i for i, ok in enumerate(self._alive) if ok]
        refs = {i: getattr(self.replicas[i], method).remote(*refs_in, version) for i in live}
        deadline = time.monotonic() + self.push_timeout_s  # the pushes run at once: one deadline
        for i, ref in refs.items():
            try:
                ray.get(ref, timeout=_left(deadline))
            except _dead_errors(ray) as exc:
                self._mark_dead(i, f"died ({type(exc).__name__}) during the weight push", 0)
            except ray.exceptions.GetTimeoutError:
                self._drop_stuck(i, f"the weight push ({method})", "rollout.push_timeout_s", self.push_timeout_s, 0)
        if not any(self._alive):
            raise NoReplicaLeft(self._none_left(f"the weight push of version {version} reached none"))
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
        refs = {i: r.stats.remote() for i, r in enumerate(self.replicas) if self._alive[i]}
        return [self._answer(i, refs[i], "stats") if i in refs else None for i in range(len(self.replicas))]

    def _answer(self, replica: int, ref: Any, call: str) -> Any:
        """``ray.get(ref)`` of one replica's ``call``, within ``generate_timeout_s``; else the replica
        is killed and marked dead, and one TimeoutError line says so (no other replica answers in its
        place: these calls ask that replica)."""
        try:
            return self._ray.get(ref, timeout=self.generate_timeout_s)
        except self._ray.exceptions.GetTimeoutError:
            why = self._drop_stuck(replica, call, "rollout.generate_timeout_s", self.generate_timeout_s, 0)
            raise TimeoutError(f"{why}; if it is only slow, raise rollout.generate_timeout_s (seconds; "
                               "docs/distributed.md, 'Timeouts of remote calls')") from None
        except _dead_errors(self._ray) as exc:
            self._mark_dead(replica, f"died ({type(exc).__name__}) during {call}", 0)
            raise ReplicaLost(f"engine replica {replica} (pid {self.pids[replica]}) died during {call}: "
                              f"{type(exc).__name__}") from None

    @property
    def alive(self) -> list[bool]:
        return list(self._alive)

    def kill_replica(self, replica: int) -> None:
        """Kill a replica's actor (failure drills and tests); routing notices on its next call."""
        self._ray.kill(self.replicas[replica], no_restart=True)

    def close(self, shutdown: bool = False) -> None:
        """Kill the replicas this engine created (an attached one leaves them to their owner), and
        ``ray.shutdown()`` when ``shutdown``."""
        for i, r in enumerate(self.replicas):
            if self._alive[i] and self.owner:
                try:
                    self._ray.kill(r, no_restart=True)
                except Exception as exc:  # noqa: BLE001 -- closing must go on; logged
                    logger.warning("killing engine replica %d failed: %s", i, exc)
            self._alive[i] = False
        if shutdown:
            self._ray.shutdown()


def _resources(resources: Mapping[str, float] | None) -> dict[str, float]:
    """``resources`` as Ray's ``resources`` actor option (names to float quantities; {} for None)."""
    return {str(k): float(v) for k, v in (resources or {}).items()}


def _replica_options(replicas: int, names: Sequence[str] | None,
                     resources: Mapping[str, float] | None = None) -> list[dict]:
    """Each replica's extra actor options (a name in vagent's namespace when ``names`` is given;
    the OpenMP wait settings of a process vagent starts, :func:`vagent.omp.child_wait_env`, in its
    runtime env; the Ray custom ``resources`` it requires, which pin it to the nodes that offer
    them), after checking the count."""
    from vagent.omp import child_wait_env

    if replicas < 1:
        raise ValueError(f"RemoteEngine needs replicas >= 1, got {replicas}")
    if names is not None and len(names) != replicas:
        raise ValueError(f"RemoteEngine: {len(names)} names for {replicas} replicas")
    runtime_env = {"env_vars": child_wait_env(os.environ)}  # decided once, as the replicas start
    each: list[str | None] = list(names) if names is not None else [None] * replicas
    pinned = {"resources": _resources(resources)} if resources else {}
    return [{"runtime_env": runtime_env, **pinned, **({} if n is None else {"name": n, "namespace": NAMESPACE})}
            for n in each]


def _running_ray() -> Any:
    ray = import_ray()
    if not ray.is_initialized():
        raise RuntimeError("RemoteEngine needs a running Ray cluster: call "
                           "vagent.models.remote.start_ray() (or ray.init(...)) first")
    return ray


def _unwrap(model: Any) -> Any:
    from vagent.models.forward import unwrap

    return unwrap(model)


def _cpu_copy(model: Any, dtype: Any = None) -> Any:
    """A CPU copy of the (unwrapped) model in eval mode, in the trainer's dtype (or ``dtype``)."""
    import copy

    out = copy.deepcopy(_unwrap(model)).to("cpu").eval()
    return out if dtype is None else out.to(dtype)


__all__ = ["RemoteEngine", "NoReplicaLeft", "ReplicaLost", "EngineReplica", "VLLMReplica", "PushGate", "start_ray", "join_ray", "import_ray",
           "token_logprobs", "RAY_HINT", "adapter_names", "check_adapter_push", "pushed_state", "PUSH_TIMEOUT_S",
           "GENERATE_TIMEOUT_S"]
