"""The Ray cluster that engine replicas run in, and how a replica actor is placed in it.

Ray is an optional extra (``pip install 'vagent[ray]'``), imported when a ``RemoteEngine``
(:mod:`vagent.models.remote`) is built: :func:`import_ray` names the install when it is missing.
:func:`start_ray` starts a small local cluster with settings measured on a 2-core machine (256 MB
object store, no dashboard, token auth off for a loopback cluster), or joins the one in
``RAY_ADDRESS`` (:func:`join_ray`: a cluster started with ``ray start``, replicas on other hosts).
No Ray process of a local cluster outlives the process that started it
(:mod:`vagent.models.ray_reaper`).

:func:`replica_options` are each replica actor's options: its name in the ``vagent`` namespace
(the ranks of a job share rank 0's replicas), the OpenMP settings of its runtime env, and the Ray
custom resources it requires (``rollout.replica_resources``), which pin it to the nodes started
with them. Every name here is importable from :mod:`vagent.models.remote` too.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Mapping, Sequence

logger = logging.getLogger(__name__)

RAY_HINT = "pip install 'vagent[ray]'"
#: Ray namespace of named replicas (shared by the ranks of a job)
NAMESPACE = "vagent"


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
    listens on loopback only and Ray 2.60 would otherwise write a token file. Workers (engine
    replicas, sweep trials) run at the driver's priority (``RAY_worker_niceness=0`` unless the
    caller set it; at Ray's default +15 a worker's CPU work took 29x as long beside two busy
    processes on a 2-core machine: bench/busy_replica.py), and no idle worker is started ahead of
    demand (``RAY_prestart_worker_first_driver=0``, ``RAY_enable_worker_prestart=0``). On a busy machine
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
    # workers (the engine replicas: the rollout's generators) at the driver's priority: at Ray's default
    # niceness +15 any busy process beside them takes the cores first, and the rollout crawls
    os.environ.setdefault("RAY_worker_niceness", "0")
    # no idle workers started ahead of demand: vagent's Ray work is actors (replicas, trials), each in
    # a worker of its own, so a prestarted worker only costs its start-up (~0.9 s of CPU a cluster)
    os.environ.setdefault("RAY_prestart_worker_first_driver", "0")
    os.environ.setdefault("RAY_enable_worker_prestart", "0")
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


def actor_resources(resources: Mapping[str, float] | None) -> dict[str, float]:
    """``resources`` as Ray's ``resources`` actor option (names to float quantities; {} for None)."""
    return {str(k): float(v) for k, v in (resources or {}).items()}


def replica_options(replicas: int, names: Sequence[str] | None,
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
    pinned = {"resources": actor_resources(resources)} if resources else {}
    return [{"runtime_env": runtime_env, **pinned, **({} if n is None else {"name": n, "namespace": NAMESPACE})}
            for n in each]


def running_ray() -> Any:
    """The ``ray`` module of this process's running cluster; a RuntimeError naming the start when none runs."""
    ray = import_ray()
    if not ray.is_initialized():
        raise RuntimeError("RemoteEngine needs a running Ray cluster: call "
                           "vagent.models.ray_cluster.start_ray() (or ray.init(...)) first")
    return ray
