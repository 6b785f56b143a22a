"""The streaming rollout (``rollout.max_staleness: K``): generators that never wait for the
trainer, trajectories that continue on newer weights, bounded staleness.

With ``overlap: 1`` the next step's rollout runs beside the update, but it is sampled whole by
one weights version and the trainer then waits for its slowest trajectory. Here the rollouts of
the next ``K`` steps run at once on the engine replicas, each a thread of its own, and:

- after each update the trainer's weights are pushed at once (``get(k)``, canary checked), while
  those rollouts are in flight; a trajectory's next turn samples with the new weights (replicas
  stamp every reply with the version that sampled it), so one trajectory can span versions;
- the rollout of step ``s`` starts when the trainer has made ``s - K`` updates, so every token of
  the batch the trainer takes at step ``s`` is at most ``K`` updates old, by construction
  (``rollout/staleness_max <= K``; a batch older than that is an error, never silently trained);
- batches are formed by step, as in every other mode (step ``s``'s env seeds; completion order is
  :mod:`vagent.rollout.completion`), so a run's only timing-dependent input is which version
  sampled each turn: the schedule,
  recorded in ``<run>/rollout_schedule.jsonl`` and replayable (``rollout.replay_schedule``,
  :mod:`vagent.rollout.schedule`).
- a checkpoint keeps the trajectories in flight as they are (one process): it pauses generation
  (the replies being generated are finished first), keeps each finished rollout's episodes and
  each unfinished one's replies so far (``inflight.pt``: a list of
  :class:`~vagent.rollout.driver.InFlight`, one per step in flight; an unfinished rollout's has
  ``replies``, :mod:`vagent.rollout.journal`), and generation goes on right after the next push.
  A resume runs each unfinished rollout again from its env resets with those replies served (its
  env steps replay the actions), then generates on, so under the same schedule the resumed run
  equals the uninterrupted one, which paused at the same steps. In a job of several ranks each
  rank journals the replies of its share; the checkpoint gathers them by their ids in the run
  (a rollout finished on one rank has finished on all: its gather passed), and a resumed rank
  serves those of its share.

The loss for mixed versions is decoupled PPO (``vagent.recipes.stages.off_policy``): the ratio
against the trainer's log-probs before the update (the proximal policy), times the truncated
per-token behaviour weight ``min(pi_prox / pi_behav, C)`` (``rollout_correction.is_threshold``).

K = 1 is overlap 1's schedule with pushes that land mid-rollout. Needs engine replicas
(``rollout.replicas >= 1``). In a job of several ranks each rank plays its share of every rollout
on the shared replicas, and the K + 1 rollouts in flight gather their episodes on K + 1 process
groups of their own (step ``s`` on group ``s mod (K + 1)``: a group holds one rollout at a time),
beside the trainer's collectives on the default group; rank 0 records the schedule. A job replays
one as a process does: each rank's gate owes and holds the turns of the trajectories it plays
(``TrainRollout.share``: their ids in the record, where the rank numbers them from 0), and the
push, a collective, starts only when every rank's gate let it.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Sequence

from vagent.rollout.driver import InFlight, RolloutDriver
from vagent.rollout.finish import RolloutResult
from vagent.rollout.journal import ReplyJournal, on_engine, reply_versions
from vagent.rollout.policy import Policy
from vagent.rollout.records import Episode
from vagent.rollout.schedule import (
    GatedPolicy, RecordedSchedule, ScheduleError, ScheduleLog, VersionGate, diverged, turn_versions,
)

if TYPE_CHECKING:
    import torch

    from vagent.rollout.canary import WeightCanary
    from vagent.rollout.replicas import PushedEngine
    from vagent.rollout.loop import TrainRollout

logger = logging.getLogger(__name__)


def staleness(episodes: Sequence[Episode], step: int) -> dict[str, float]:
    """The batch's staleness against a trainer that made ``step`` updates
    (:func:`vagent.rl.decoupled.staleness_metrics` on one row per versioned turn: each token's
    version, the turn's unless a push split the reply (``token_versions``); a turn without sampled
    tokens weighs as one): ``rollout/staleness_min`` / ``_mean`` / ``_max``,
    ``rollout/multi_version_frac`` and ``rollout/split_replies`` (replies a push stopped and that
    continued on newer weights: ``rollout.interrupt``). Empty when no turn has a version."""
    import torch

    from vagent.rl.decoupled import staleness_metrics

    rows = [(e.traj_id, getattr(t, "token_versions", None) or [t.weights_version] * max(1, len(t.sampled_token_ids)))
            for e in episodes for t in e.turns if t.weights_version is not None]
    if not rows:
        return {}
    width = max(len(v) for _, v in rows)
    versions = torch.tensor([v + [v[-1]] * (width - len(v)) for _, v in rows])
    mask = torch.tensor([[1] * len(v) + [0] * (width - len(v)) for _, v in rows])
    out = staleness_metrics(versions, mask, step, torch.tensor([traj for traj, _ in rows]))
    out["rollout/split_replies"] = float(sum(len(set(v)) > 1 for _, v in rows))
    return out


def _journalable(policy: Policy) -> bool:
    """Whether a copy of ``policy`` with another ``engine`` generates as it does (an HFPolicy
    builds each turn's conversation itself and samples on its ``engine``)."""
    from vagent.rollout.hf_policy import HFPolicy

    return isinstance(policy, HFPolicy)


def _share(run: object, step: int) -> range:
    """The trajectory ids this rank plays in the rollout of ``step`` (``TrainRollout.share``); a
    plain callable standing in for the run's rollout plays them all."""
    share = getattr(run, "share", None)
    return share(step) if share is not None else range(1 << 62)


class StreamingDriver(RolloutDriver):
    """Step ``k``'s episodes from a stream of rollouts (see the module docstring).

    Args (beyond :class:`RolloutDriver`'s):
        max_staleness: K >= 1, how many updates the oldest token of a batch may be behind.
        log: where each taken batch's schedule is recorded (None: not recorded).
        replay: a recorded schedule to hold the turns and pushes to (None: free-running).
        first_step: the first step the run takes (0, or the resumed run's updates done).
    """

    def __init__(self, run: TrainRollout, policy: Policy, *, engine: PushedEngine, model: torch.nn.Module,
                 max_staleness: int, steps: int, owns_ray: bool = False, canary: WeightCanary | None = None,
                 log: ScheduleLog | None = None, replay: RecordedSchedule | None = None, first_step: int = 0,
                 deadline_s: float = 1800.0):
        if max_staleness < 1:
            raise ValueError(f"max_staleness must be >= 1, got {max_staleness}")
        super().__init__(run, policy, engine=engine, model=model, overlap=0, steps=steps, owns_ray=owns_ray,
                         canary=canary)
        self.max_staleness, self.log, self.replay = max_staleness, log, replay
        self.gate = VersionGate(replay, first_step, deadline_s) if replay is not None else None
        self._stream = ThreadPoolExecutor(max_workers=max_staleness + 1, thread_name_prefix="vagent-stream")
        from vagent.distributed import side_group

        # a job's rollouts in flight gather their episodes each on a group of its own (None: one process)
        self._groups = [side_group(f"streamed rollout {i}") for i in range(max_staleness + 1)]
        self._rollouts: dict[int, Future[RolloutResult]] = {}
        self._done: dict[int, InFlight] = {}  # rollouts a resume handed back
        # every reply of the rollouts in flight (a job's rank: of its share), so a checkpoint keeps them half-finished
        self.journal = ReplyJournal() if _journalable(policy) else None
        self._taken = first_step  # updates done at the last take (the next push's version - 1)

    def _rollout(self, step: int) -> RolloutResult:
        from vagent.distributed import on_group

        policy = self.policy
        if self.journal is not None:  # the same policy on this rollout's journaled engine
            policy = on_engine(policy, self.journal.engine(getattr(policy, "engine"), step))
        if self.gate is not None:  # a job's rank numbers its trajectories from 0, the record from its share's first
            policy = GatedPolicy(policy, self.gate, step, offset=_share(self.run, step).start)
        try:
            with on_group(self._groups[step % len(self._groups)]):
                return self.run(policy, step, False)
        finally:
            if self.gate is not None:
                self.gate.finished(step)

    def _submit(self, step: int) -> None:
        if step in self._rollouts or step in self._done or step >= self.steps:
            return
        if self.gate is not None:  # this rank's trajectories' recorded turns are owed before a newer push
            self.gate.started(step, _share(self.run, step))
        self._rollouts[step] = self._stream.submit(self._rollout, step)

    def _push_now(self, version: int) -> None:
        if self.gate is not None:
            self.gate.before_push(version)
        super()._push_now(version)
        if self.gate is not None:
            self.gate.pushed(version)
        if self.journal is not None:  # a checkpoint's pause ends with the weights it saved
            self.journal.release()

    def _verify(self, version: int) -> None:
        """The canary's check; its metrics are kept for every version a batch in flight may hold."""
        if self.canary is not None:
            self._sync = {v: m for v, m in self._sync.items() if v >= version - self.max_staleness}
            self._sync[version] = self.canary.check(self.engine, version)

    def get(self, step: int) -> RolloutResult:
        """Push the weights of ``step`` updates (while the stream runs), keep the rollouts of steps
        ``step .. step + K`` in flight, and return step ``step``'s once done."""
        self._push(step)
        for s in range(step, step + self.max_staleness + 1):
            self._submit(s)
        if step in self._done:
            episodes = self._done.pop(step).episodes
        else:
            episodes = self._rollouts.pop(step).result()
        if self.journal is not None:
            self.journal.forget(step)
        self._taken = step
        self._take(episodes, step)
        return episodes

    def _take(self, episodes: RolloutResult, step: int, bounded: bool = True,
              record: dict | None = None) -> None:
        """Check the batch against the staleness bound (``bounded``) and the replayed record,
        record its schedule (with ``record``'s fields), and add its metrics."""
        versions = turn_versions(episodes)
        missing = sum(v < 0 for vs in versions.values() for v in vs)
        if missing:
            raise RuntimeError(f"step {step}'s rollout has {missing} turn(s) without a weights version: the engine "
                               f"{type(self.engine).__name__} does not stamp its replies, so the stream cannot bound "
                               "their staleness. Report this with the run's train.log.")
        oldest = min((v for vs in versions.values() for v in vs), default=step)
        if bounded and step - oldest > self.max_staleness:
            raise RuntimeError(f"step {step}'s batch holds a turn sampled with weights {oldest}, "
                               f"{step - oldest} updates old, over rollout.max_staleness={self.max_staleness}: the "
                               "stream started a rollout too early. Report this with the run's train.log.")
        if self.replay is not None and step in self.replay.steps:
            where = diverged(self.replay.steps[step], versions)
            if where is not None:
                raise ScheduleError(f"replaying {self.replay.path}: step {step}'s batch diverged from the record "
                                    f"({where}); the replay needs the recorded run's model and config")
        if self.log is not None:
            self.log.record(step, episodes, record)
        metrics = getattr(episodes, "metrics", None)
        if metrics is not None:
            metrics.update(staleness(episodes, step))
            metrics["rollout/weights_version"] = float(oldest)
            metrics["rollout/weights_lag"] = float(step - oldest)
            metrics["mismatch/staleness"] = metrics.get("rollout/staleness_mean", 0.0)
            metrics["rollout/in_flight"] = float(len(self._rollouts) + len(self._done))
            for v in sorted({v for vs in versions.values() for v in vs}):
                if v in self._sync:  # the canary's check of the newest version in the batch
                    metrics.update(self._sync[v])

    def in_flight(self) -> list[InFlight] | None:
        """What a checkpoint saves so that a resume trains the next steps on the same episodes: per
        rollout in flight, its episodes when it has finished, else its trajectories' replies so far
        (a job: every rank's, by their ids in the run), taken while generation is paused (until the
        next push); without a journal (a policy other than an HFPolicy) every rollout in flight is
        waited for (no push meanwhile). A replayed run first lets the turns the record samples with
        the current weights be sampled (the next push waits for them)."""
        from vagent.distributed import gather_objects

        if self.journal is not None:
            if self.gate is not None:
                self.gate.before_push(self._taken + 1)
            self.journal.pause()
        # a rollout finished on one rank of a job has finished on every one (its episodes' gather passed)
        done = {s for s, future in self._rollouts.items() if self.journal is None or future.done()}
        done = set().union(*gather_objects(sorted(done), "finished rollouts in flight"))
        for s, future in list(self._rollouts.items()):
            if s not in done:
                continue  # kept half-finished below
            episodes = future.result()
            del self._rollouts[s]
            versions = [t.weights_version for e in episodes for t in e.turns if t.weights_version is not None]
            newest = max(versions, default=s)  # the canary's check of it goes on the batch (``_take``)
            self._done[s] = InFlight(s, min(min(versions, default=s), s), episodes, dict(self._sync.get(newest, {})))
        # every rank's replies of the unfinished rollouts, in one gather, by their ids in the run (a job's
        # rank keys its own trajectories from 0)
        journal = self.journal
        mine = {s: {k + _share(self.run, s).start: v for k, v in (journal.snapshot(s) if journal is not None else {}).items()}
                for s in self._rollouts}
        parts = gather_objects(mine, "half-finished replies")
        partial = []
        for s in self._rollouts:
            replies = {k: v for part in parts for k, v in part[s].items()}
            versions = reply_versions(replies)
            newest = max(versions, default=None)
            partial.append(InFlight(s, min(min(versions, default=s), s), RolloutResult([]),
                                    dict(self._sync.get(newest, {})) if newest is not None else {}, replies=replies))
        records = sorted([*self._done.values(), *partial], key=lambda rec: rec.step)
        return records or None

    def resume_in_flight(self, saved: InFlight | list[InFlight], step: int) -> None:
        """Take back the rollouts a checkpoint kept (``in_flight()``), the first for ``step``: the
        finished ones' episodes, and the unfinished ones' replies, served when they run again."""
        records = saved if isinstance(saved, list) else [saved]
        for i, rec in enumerate(records):
            if not isinstance(rec, InFlight) or rec.step != step + i:
                raise ValueError(f"the checkpoint's in-flight rollouts do not follow step {step} in order (record {i} "
                                 f"is not the rollout of step {step + i}): the checkpoint's inflight.pt does not belong "
                                 "to this run")
            if getattr(rec, "order", None) is not None:
                raise ValueError("the checkpoint holds the groups of a completion-order stream (rollout.batch_order "
                                 "completion) and this run forms batches by step: resume with the run's config.yaml")
            replies = getattr(rec, "replies", None)
            if replies is not None:
                if self.journal is None:
                    raise ValueError(f"the checkpoint holds half-finished rollouts (step {rec.step}), which only a "
                                     "run whose policy generates through an HFPolicy (engine replicas) resumes; "
                                     "resume it with the run's config.yaml")
                share = _share(self.run, rec.step)  # this rank's trajectories, keyed from 0 as it plays them
                self.journal.hold({k - share.start: v for k, v in replies.items() if k in share}, rec.step)
                newest = max(reply_versions(replies), default=None)
            else:
                self._done[rec.step] = rec
                newest = max((t.weights_version for e in rec.episodes for t in e.turns
                              if t.weights_version is not None), default=None)
            if rec.sync and newest is not None:
                self._sync.setdefault(newest, dict(rec.sync))

    def close(self) -> None:
        """Wait for the rollouts in flight (their results unused), then close as the base driver."""
        if self.journal is not None:  # a last checkpoint's pause
            self.journal.release()
        for s, future in list(self._rollouts.items()):
            try:
                future.result()
            except Exception as exc:  # noqa: BLE001 -- the run is ending; the rollout is not used
                logger.warning("the streamed rollout of step %d failed: %s", s, exc)
        self._rollouts.clear()
        self._stream.shutdown(wait=True)
        super().close()


__all__ = ["StreamingDriver", "staleness"]
