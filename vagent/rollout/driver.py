"""Where a run's training rollouts are generated, and when: ``RolloutDriver``.

The RL recipes ask the driver for step ``k``'s episodes (``driver.get(k)``, a ``RolloutResult``),
on every configuration: ``make_driver`` reads the run config's ``rollout`` section once and builds
the driver for it (the generators apart from the trainer's model, and the weight push, are built in
:mod:`vagent.rollout.replicas`). Its whole interface is ``start``, ``get(step)``, ``in_flight()``,
``resume_in_flight`` and ``close``. A step ``k`` here counts updates done (the trainer's weights
version): ``get(k)`` is the rollout of RL step ``k + 1``.

- ``engine: hf, replicas: 0, schedule: lockstep, overlap: 0`` (the default): ``get`` runs the
  training rollout with the recipe's own in-process ``HFPolicy`` (no engine, no push, no
  background rollout; its turns carry no weights version, so no ``rollout/weights_*`` metric).
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
  A checkpoint keeps what is in flight (``in_flight()``: the next step's episodes, waited for, the
  weights version that sampled them and its canary metrics; ``inflight.pt``) and a resume hands it
  back (``resume_in_flight``), so the resumed run trains step k+1 on the same episodes, sampled with
  the same weights, as the uninterrupted one.

The rollout a driver runs is the run's :class:`~vagent.rollout.loop.TrainRollout`, which
``make_driver`` builds from the run config, the judges and the run's last checkpoint; the driver
calls it as ``run(policy, step, unshard)``: ``unshard`` is True when the policy generates with the
trainer's own model (a sharded model is then gathered once for the rollout,
``vagent.distributed.generation_mode``) and False when a separate generator does (engine replicas,
vLLM), whose rollout must not touch the trainer's parameters.

Every step's metrics gain, where the engine records versions, ``rollout/weights_version`` (the
oldest weights version that sampled a turn) and ``rollout/weights_lag`` (trainer version minus
that: 0 without overlap, 1 with it). Every turn must carry the version pushed before its rollout
started: a turn sampled with other weights (a push that did not reach the generator) is an error,
not a silent off-policy batch. Validation keeps using the recipe's in-process policy (the
trainer's current weights).

``env_factory_for(entry)`` and ``close_env_factories()`` (the remote envs' connection pools) live
in :mod:`vagent.rollout.specs` and are re-exported here under their old names.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from vagent.rollout.finish import RolloutResult
from vagent.rollout.policy import Policy
from vagent.rollout.records import Episode
from vagent.rollout.replicas import PushedEngine, push_weights
from vagent.rollout.specs import _FACTORIES, close_env_factories, env_factory_for  # noqa: F401 -- their old home

if TYPE_CHECKING:  # torch, the model loader and the run config stay out of `import vagent.rollout.driver`
    import torch
    from torch.distributed import ProcessGroup

    from vagent.models.loading import LoadedModel
    from vagent.rollout.canary import WeightCanary
    from vagent.rollout.loop import TrainRollout
    from vagent.runconfig import RolloutConfig, RunConfig

logger = logging.getLogger(__name__)


def check_rollout_setup(settings: RolloutConfig, distributed: bool) -> None:
    """Refuse, before anything is built, rollout settings this process cannot run: engine replicas
    without Ray installed, vLLM without vLLM, an in-process vLLM in a job of several ranks."""
    import importlib.util

    from vagent.config import ConfigError

    if distributed and settings.engine == "vllm" and settings.replicas == 0:
        raise ConfigError("rollout.engine vllm in a job of several ranks runs as Ray actor replicas that every rank "
                          "shares (rank 0 pushes the gathered weights): set rollout.replicas N >= 1, or run one "
                          "process (vLLM in the training process).")
    if settings.replicas >= 1 and importlib.util.find_spec("ray") is None:
        raise ConfigError("rollout.replicas >= 1 runs engine replicas as Ray actors, and Ray is not installed: "
                         "pip install 'vagent[ray]' (or set rollout.replicas 0 to generate in the training process).")
    if settings.engine == "vllm" and importlib.util.find_spec("vllm") is None:
        from vagent.models.vllm_setup import VLLM_HINT

        raise ConfigError(f"rollout.engine vllm needs vLLM, which is not installed: {VLLM_HINT}; or set "
                          "rollout.engine hf.")


def is_default(settings: RolloutConfig) -> bool:
    """Whether the rollout settings are the in-process, lockstep, overlap-free default."""
    return (settings.engine == "hf" and settings.replicas == 0 and settings.schedule == "lockstep"
            and settings.overlap == 0)


@dataclass
class InFlight:
    """The rollout an overlapped run has in flight at a checkpoint: step ``step``'s episodes,
    sampled with weights ``version`` (the trainer's after ``version`` updates), the canary's
    ``sync/*`` metrics of that version (the same episodes' record), and the id of the run that
    sampled them (``run.json``'s; None outside a run directory, or in an older vagent's record).
    A streaming run's rollout that had not finished has no episodes and ``replies`` instead: its
    trajectories' engine outputs so far, ``{trajectory key: [output as plain data, ...]}``
    (:mod:`vagent.rollout.journal`), and ``version`` is the oldest that sampled one of them.
    Saved as the checkpoint's ``inflight.pt``, read back as data (``vagent.runs.safe_load``)."""

    step: int
    version: int
    episodes: RolloutResult
    sync: dict[str, float] = field(default_factory=dict)
    run_id: str | None = None
    replies: dict[int, list[dict]] | None = None
    #: a completion-order stream's (``rollout.batch_order: completion``): its finished groups not yet
    #: taken, whose episodes ``episodes`` holds in that order: ``{"units": [[unit, attempt,
    #: episodes], ...], "metrics": [each group's rollout metrics], "running": [[unit, attempt,
    #: its replies so far], ...], "started": the last step whose groups were started}``
    order: dict | None = None

    def __getstate__(self) -> dict:
        """The pickled state: ``episodes`` as ``{"episodes": [Episode, ...], "metrics": {...}}``
        (a weights-only load rebuilds no list subclass such as ``RolloutResult``)."""
        episodes = {"episodes": list(self.episodes), "metrics": dict(getattr(self.episodes, "metrics", {}))}
        return {**self.__dict__, "episodes": episodes}

    def __setstate__(self, state: dict) -> None:
        episodes = state.get("episodes")
        if isinstance(episodes, dict):
            episodes = RolloutResult(list(episodes.get("episodes", [])), dict(episodes.get("metrics", {})))
        self.__dict__.update({**state, "episodes": episodes})


class RolloutDriver:
    """Step ``k``'s training episodes from the configured generator (see the module docstring).

    Args:
        run: the run's rollout of one step (``TrainRollout``, built by ``make_driver``).
        policy: the policy to roll out with (the recipe's own one on the default path).
        engine: the generator whose weights are pushed (``update_weights(model, version)``), or None.
        model: the trainer's model (pushed to ``engine``).
        overlap: 0, or 1 to roll out step k+1 while step k updates.
        steps: the run's last step + 1 (no rollout is started beyond it).
        owns_ray: ``close()`` shuts the Ray cluster down (the driver started it).
        canary: checks ``engine`` against ``model`` after every push (``vagent.rollout.canary``);
            its ``sync/*`` metrics go on the episodes sampled with the weights it checked.
    """

    def __init__(self, run: TrainRollout, policy: Policy, *, engine: PushedEngine | None = None,
                 model: torch.nn.Module | None = None, overlap: int = 0, steps: int = 0, owns_ray: bool = False,
                 canary: WeightCanary | None = None):
        if overlap not in (0, 1):
            raise ValueError(f"overlap must be 0 or 1, got {overlap}")
        if overlap and engine is None:
            raise ValueError("overlap 1 needs a generator apart from the trainer's model (engine replicas or vLLM)")
        self.run, self.policy, self.engine, self.model = run, policy, engine, model
        self.overlap, self.steps, self.owns_ray = overlap, steps, owns_ray
        self.canary = canary
        self._sync: dict[int, dict[str, float]] = {}  # weights version -> the canary's sync/ metrics
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vagent-overlap") if overlap else None
        self._pending: tuple[int, Future[RolloutResult], int] | None = None  # (step, its rollout, weights version)
        # the background rollout's collectives (a job's episode gather) run on a group of their own
        self._group: ProcessGroup | None = None
        if overlap:
            from vagent.distributed import side_group

            self._group = side_group("overlapped rollout")

    @property
    def unshard(self) -> bool:
        """Whether the rollout generates with the trainer's own model (no separate generator)."""
        return self.engine is None

    def _run_beside(self, step: int) -> RolloutResult:
        """The training rollout of ``step`` in the background thread, on the driver's own group."""
        from vagent.distributed import on_group

        with on_group(self._group):
            return self.run(self.policy, step, self.unshard)

    def start(self, push: bool) -> None:
        """Version 0 of the generator: push the trainer's weights when ``push`` (vLLM loaded the
        model directory, which may predate SFT; hf replicas copied the trainer's model), then check
        them with the canary."""
        if push:
            self._push_now(0)
        else:
            self._verify(0)

    def _push(self, version: int) -> None:
        if self.engine is not None and self.engine.weights_version != version:
            self._push_now(version)

    def _push_now(self, version: int) -> None:
        """Push the trainer's weights to the engine as ``version``, then the canary's check."""
        if self.engine is None or self.model is None:
            raise RuntimeError("a weight push needs the driver's engine and the trainer's model: build the driver "
                               "with engine= and model= (make_driver does)")
        push_weights(self.engine, self.model, version)
        self._verify(version)

    def _verify(self, version: int) -> None:
        """The canary's check of the weights just pushed (raises ``WeightSyncError`` before any
        rollout samples with them); its metrics are kept for the episodes of that version."""
        if self.canary is not None:  # keep the previous version's too: an overlapped rollout sampled with it
            self._sync = {v: m for v, m in self._sync.items() if v >= version - 1}
            self._sync[version] = self.canary.check(self.engine, version)

    def get(self, step: int) -> RolloutResult:
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
        elif (sleep := getattr(self.engine, "sleep", None)) is not None:
            sleep()  # a colocated vLLM frees its KV cache while the trainer updates
        self._annotate(episodes, step, version if self.engine is not None else None)
        return episodes

    def in_flight(self) -> InFlight | list[InFlight] | None:
        """The background rollout, waited for (None without one): what a checkpoint saves so that a
        resume trains the next step on the same episodes. The next ``get`` takes the same result."""
        if self._pending is None:
            return None
        step, future, version = self._pending
        return InFlight(step, version, future.result(), dict(self._sync.get(version, {})))

    def resume_in_flight(self, saved: InFlight | list[InFlight], step: int) -> None:
        """Take back the rollout a checkpoint saved (``in_flight()``) as step ``step``'s, the first
        step of the resumed run; a record of another step is refused (it is not this run's)."""
        if isinstance(saved, list):
            raise ValueError("the checkpoint holds the in-flight rollouts of a streaming run (rollout.max_staleness "
                             ">= 1) and this run is not streaming")
        if not isinstance(saved, InFlight) or saved.step != step or saved.version > step:
            what = (f"step {saved.step}, weights {saved.version}" if isinstance(saved, InFlight)
                    else type(saved).__name__)
            raise ValueError(f"the checkpoint's in-flight rollout ({what}) is not the rollout of step {step} that the "
                             "resume starts with: the checkpoint's inflight.pt does not belong to it")
        if self._pool is None:
            raise ValueError("the checkpoint holds an in-flight rollout (rollout.overlap 1) and this run has overlap 0")
        done: Future[RolloutResult] = Future()
        done.set_result(saved.episodes)
        self._pending = (saved.step, done, saved.version)
        if saved.sync:
            self._sync[saved.version] = dict(saved.sync)

    def _annotate(self, episodes: Sequence[Episode], step: int, pushed: int | None) -> None:
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
            # updates between sampling and this update, per turn (0 without overlap, 1 with it)
            episodes.metrics["mismatch/staleness"] = sum(step - v for v in versions) / len(versions)
        if pushed is not None and pushed in self._sync and hasattr(episodes, "metrics"):
            episodes.metrics.update(self._sync[pushed])

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


__all__ = ["InFlight", "RolloutDriver", "check_rollout_setup", "close_env_factories", "env_factory_for",
           "is_default"]
