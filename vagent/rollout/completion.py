"""Batches formed in completion order (``rollout.batch_order: completion``): the trainer takes the
first groups to finish among every rollout in flight, instead of step ``s``'s rollout whole.

With ``batch_order: step`` (:class:`~vagent.rollout.streaming.StreamingDriver`) the batch of step
``s`` is the rollout of step ``s``'s env seeds, and the trainer waits for its slowest trajectory
while finished trajectories of later rollouts wait behind it. Here the stream's unit of work is one
env group (``group_size`` trajectories of one env seed: GRPO's and GiGPO's unit), so:

- the groups of the rollouts of steps ``s .. s + K`` run at once, each on its own thread (started,
  as in step order, when the trainer has made ``s - K`` updates); a group's id is its *unit*,
  ``slot * G + g`` (slot: the step whose env seeds it plays; ``G`` groups a step);
- the batch of step ``s`` is the first ``G`` groups to finish (completion order), whatever their
  slot; a group not taken stays finished in the stream for the next batch;
- a group taken more than K updates after its oldest token (a slow group of an earlier slot) is
  dropped and played again on the newest weights (``rollout.too_stale: drop``, the default; counted
  in ``rollout/dropped``), or trained with the decoupled loss's truncated behaviour weights
  (``keep``; ``rollout/staleness_max`` may then exceed K);
- each group samples with seeds of its own (the slot's sampling seed derived with the group's
  index) and its trajectories are routed to the replicas by keys of their own; in the batch the
  groups are numbered in the order taken (``group_id`` = position, ``traj_id`` = position *
  group_size + member);
- the schedule records, per batch, the groups taken (``"units": [[unit, attempt], ...]``) and those
  dropped with their turns' versions (``"dropped"``); ``rollout.replay_schedule`` holds each group's
  turns to their recorded versions, drops the recorded groups, and takes the recorded groups in the
  recorded order, so a replay gives the same batches;
- a checkpoint keeps the finished groups not yet taken, in completion order, with their metrics,
  the last slot started, and each unfinished group's replies so far (the reply journal,
  :mod:`vagent.rollout.journal`, keyed by group attempt; generation paused until the next push),
  in one ``InFlight`` with ``order``, so ``--resume`` takes the same groups in the same order and
  plays the unfinished ones on from their replies (after its first push). Without a journal (a
  policy other than an HFPolicy) it drains: every group in flight finishes first.

In a job of several ranks each rank plays the groups of its block of env seeds (the block it plays
in step order, ``spec_blocks``) in every slot, on its own, and forms its share of the batch from the
first of its own groups to finish (as many as its block holds); the shares are gathered in rank
order, so the batch's positions follow the blocks. A rank decides its drops on its own; the record
lists every rank's groups, and a replay holds each rank to the groups the record gives its block.
A job's checkpoint gathers every rank's finished and half-finished groups; on resume each rank
takes back those of its block.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Sequence

from vagent.rollout.driver import InFlight
from vagent.rollout.finish import RolloutResult
from vagent.rollout.policy import Policy
from vagent.rollout.records import Episode
from vagent.rollout.journal import on_engine, reply_versions
from vagent.rollout.schedule import GatedPolicy, RecordedSchedule, ScheduleError, VersionGate, turn_versions
from vagent.rollout.streaming import StreamingDriver

#: attempts of one group (a group dropped as too stale is played again): the gate's key per attempt
MAX_ATTEMPTS = 1000


class _Rekeyed:
    """An engine whose requests' routing keys are offset (each group's trajectories count from 0:
    without the offset every group's trajectory 0 would go to one replica)."""

    def __init__(self, inner: Any, offset: int):
        self.inner, self.offset = inner, offset

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def generate(self, requests: Sequence[Any], params: Any) -> list[Any]:
        moved = [dataclasses.replace(r, key=None if r.key is None else self.offset + int(r.key)) for r in requests]
        return self.inner.generate(moved, params)


def unit_gate_schedule(replay: RecordedSchedule, group_size: int) -> RecordedSchedule:
    """The recorded schedule of a completion-order run keyed for the gate: per group attempt
    (``unit * MAX_ATTEMPTS + attempt``) its members' turn versions, from the batches that took the
    groups (trajectory ``position * group_size + member``) and those that dropped them."""
    steps: dict[int, dict[int, list[int]]] = {}
    for step, batch in replay.batches.items():
        taken = replay.steps.get(step, {})
        for pos, (unit, attempt) in enumerate(batch["units"]):
            steps[unit * MAX_ATTEMPTS + attempt] = {m: taken.get(pos * group_size + m, []) for m in range(group_size)}
        for unit, attempt, versions in batch["dropped"]:
            steps[unit * MAX_ATTEMPTS + attempt] = dict(versions)
    return dataclasses.replace(replay, steps=steps, batches={})


def _versions(episodes: Sequence[Episode]) -> list[int]:
    return [v for e in episodes for t in e.turns
            for v in ((getattr(t, "token_versions", None) or [t.weights_version]) if t.weights_version is not None
                      else [])]


class CompletionDriver(StreamingDriver):
    """Step ``k``'s episodes: the first groups to finish (see the module docstring).

    Args (beyond :class:`StreamingDriver`'s): ``too_stale``: ``drop`` (play a group older than
    ``max_staleness`` again) or ``keep`` (train it, corrected); ``group_size``: trajectories a group."""

    def __init__(self, run: Any, policy: Policy, *, too_stale: str = "drop", group_size: int = 1, **kw: Any):
        if too_stale not in ("drop", "keep"):
            raise ValueError(f"too_stale must be drop or keep, got {too_stale!r}")
        super().__init__(run, policy, **kw)
        self.too_stale, self.group_size = too_stale, group_size
        first = kw.get("first_step", 0)
        self.n_groups = run.groups(first)
        from vagent.distributed import world
        from vagent.rollout.loop import spec_blocks

        job = world()  # this rank's env groups (every one in one process)
        self.own = range(*spec_blocks(self.n_groups, job.size)[job.rank])
        if self.replay is not None:
            self.gate = VersionGate(unit_gate_schedule(self.replay, group_size), first, kw.get("deadline_s", 1800.0))
        self._units: dict[int, Future[RolloutResult]] = {}  # groups in flight or finished, not taken
        self._attempt: dict[int, int] = {}  # each group's current attempt
        self._order: list[int] = []  # finished groups not taken, in completion order
        self._cv = threading.Condition()
        self._started = first - 1  # the last slot whose groups were started
        self._resumed: list[tuple[int, int]] = []  # half-finished groups a resume starts after its first push
        self._group_pool = ThreadPoolExecutor(max_workers=(self.max_staleness + 2) * max(1, len(self.own)),
                                        thread_name_prefix="vagent-group")

    # ------------------------------------------------------------------ the stream
    def _key(self, unit: int, attempt: int | None = None) -> int:
        """A group attempt's key (the gate's and the journal's): its current attempt by default."""
        return unit * MAX_ATTEMPTS + (self._attempt[unit] if attempt is None else attempt)

    def _play(self, slot: int, g: int, attempt: int) -> RolloutResult:
        key = self._key(slot * self.n_groups + g, attempt)
        policy = self.policy
        engine = getattr(policy, "engine", None)
        if engine is not None:  # the same policy, its trajectories routed by keys of this group's own
            inner: Any = _Rekeyed(engine, key * max(1, self.group_size))
            if self.journal is not None:  # and its replies journaled: a checkpoint keeps it half-finished
                inner = self.journal.engine(inner, key)
            policy = on_engine(policy, inner)
        if self.gate is not None:
            policy = GatedPolicy(policy, self.gate, key)
        try:
            return self.run(policy, slot, False, group=g)
        finally:
            if self.gate is not None:
                self.gate.finished(key)

    def _submit_unit(self, unit: int, attempt: int | None = None) -> None:
        """Start group ``unit``: its next attempt, or ``attempt`` (a half-finished one resumed)."""
        attempt = self._attempt.get(unit, -1) + 1 if attempt is None else attempt
        self._attempt[unit] = attempt
        slot, g = divmod(unit, self.n_groups)
        if self.gate is not None:
            self.gate.started(self._key(unit, attempt))
        future = self._group_pool.submit(self._play, slot, g, attempt)
        self._units[unit] = future
        future.add_done_callback(functools.partial(self._finished, unit))

    def _finished(self, unit: int, future: Future[RolloutResult]) -> None:
        with self._cv:
            if self._units.get(unit) is future:
                self._order.append(unit)
            self._cv.notify_all()

    def _submit(self, step: int) -> None:
        if step <= self._started or step >= self.steps:
            return
        if self.run.groups(step) != self.n_groups:
            raise RuntimeError(f"the rollout of step {step} has {self.run.groups(step)} env groups and the first had "
                               f"{self.n_groups}: rollout.batch_order completion needs as many every step")
        self._started = step
        for g in self.own:
            self._submit_unit(step * self.n_groups + g)

    def _wait_for(self, unit: int | None) -> int:
        """The next finished group: ``unit`` once it finished, or (None) the first in completion order."""
        with self._cv:
            while True:
                if unit is None and self._order:
                    return self._order[0]
                if unit is not None and unit in self._order:
                    return unit
                if unit is not None and unit not in self._units:
                    raise ScheduleError(f"replaying {self.replay.path if self.replay else '?'}: the record takes group "
                                        f"{unit}, which this run has not started (the replay diverged)")
                self._cv.wait(timeout=5.0)

    def _pop(self, unit: int) -> RolloutResult:
        with self._cv:
            self._order.remove(unit)
            future = self._units.pop(unit)
        if self.journal is not None:
            self.journal.forget(self._key(unit))
        return future.result()

    def get(self, step: int) -> RolloutResult:
        """Push the weights of ``step`` updates, keep the groups of slots ``step .. step + K`` in
        flight, and return the first ``G`` groups to finish (the recorded ones on a replay)."""
        self._push(step)
        for unit, attempt in self._resumed:  # on the weights just pushed, as in the uninterrupted run
            self._submit_unit(unit, attempt)
        self._resumed = []
        for s in range(step, step + self.max_staleness + 1):
            self._submit(s)
        recorded = self.replay.batches.get(step) if self.replay is not None else None
        mine = self.own
        if recorded is not None:  # this rank's share of the record: its block's positions and groups
            recorded = {"units": recorded["units"][mine.start:mine.stop],
                        "dropped": [d for d in recorded["dropped"] if d[0] % self.n_groups in mine]}
        dropped: list[list[Any]] = []
        if recorded is not None:  # the record's drops first (their new attempts may be in this batch)
            for unit, attempt, _ in recorded["dropped"]:
                if self._attempt.get(unit) != attempt:
                    raise ScheduleError(f"replaying {self.replay.path}: step {step} dropped attempt {attempt} of group "  # type: ignore[union-attr]
                                        f"{unit}, and this run is at attempt {self._attempt.get(unit)}")
                res = self._pop(self._wait_for(unit))
                dropped.append([unit, attempt, turn_versions(res)])
                self._submit_unit(unit)
        taken: list[tuple[int, int, RolloutResult]] = []
        while len(taken) < len(mine):
            want = recorded["units"][len(taken)][0] if recorded is not None else None
            unit = self._wait_for(want)
            attempt = self._attempt[unit]
            if recorded is not None and recorded["units"][len(taken)][1] != attempt:
                raise ScheduleError(f"replaying {self.replay.path}: step {step} took attempt "  # type: ignore[union-attr]
                                    f"{recorded['units'][len(taken)][1]} of group {unit}, and this run is at attempt "
                                    f"{attempt}")
            res = self._pop(unit)
            oldest = min(_versions(res), default=step)
            if recorded is None and self.too_stale == "drop" and step - oldest > self.max_staleness:
                dropped.append([unit, attempt, turn_versions(res)])
                self._submit_unit(unit)  # played again on the newest weights
                continue
            taken.append((unit, attempt, res))
        taken, dropped = self._gather(taken, dropped)
        episodes = self._batch(taken, step)
        episodes.metrics["rollout/dropped"] = float(len(dropped))
        record = {"units": [[u, a] for u, a, _ in taken], "dropped": [[u, a, {str(m): v for m, v in d.items()}]
                                                                     for u, a, d in dropped]}
        self._taken = step
        self._take(episodes, step, bounded=self.too_stale == "drop", record=record)
        episodes.metrics["rollout/in_flight"] = float(len(self._units))
        return episodes

    @staticmethod
    def _gather(taken: list[tuple[int, int, RolloutResult]], dropped: list[list[Any]]
                ) -> tuple[list[tuple[int, int, RolloutResult]], list[list[Any]]]:
        """Every rank's share of the batch (its groups taken and dropped), in rank order: the
        batch's positions follow the ranks' blocks (one process: its own)."""
        from vagent.distributed import gather_objects

        mine = ([(u, a, list(res), dict(getattr(res, "metrics", {}))) for u, a, res in taken], dropped)
        parts = gather_objects(mine, "completion-order batch")
        return ([(u, a, RolloutResult(eps, m)) for part, _ in parts for u, a, eps, m in part],
                [d for _, ds in parts for d in ds])

    def _batch(self, taken: list[tuple[int, int, RolloutResult]], step: int) -> RolloutResult:
        """The taken groups as one rollout: numbered in the order taken, metrics merged."""
        from vagent.rollout.loop import merge_rollouts

        for pos, (_, _, res) in enumerate(taken):
            for e in res:
                member = e.traj_id - e.group_id * self.group_size
                e.group_id, e.traj_id = pos, pos * self.group_size + member
        cfg = getattr(self.run, "cfg", None)
        schedule = cfg.rollout.schedule if cfg is not None else "async"
        merged = merge_rollouts([(list(res), dict(getattr(res, "metrics", {}))) for _, _, res in taken], schedule)
        slots = [u // self.n_groups for u, _, _ in taken]
        merged.metrics["rollout/other_slot_frac"] = sum(s != step for s in slots) / max(1, len(slots))
        return merged

    # ------------------------------------------------------------------ checkpoints
    def in_flight(self) -> list[InFlight] | None:
        """What a checkpoint keeps: the finished groups not yet taken, in completion order (with
        their metrics), the last slot started, and (one process with a journal) each unfinished
        group's replies so far, taken while generation is paused until the next push; without a
        journal every group in flight is waited for first (no push meanwhile)."""
        if self.journal is not None:
            if self.gate is not None:  # the turns the record samples with the current weights first
                self.gate.before_push(self._taken + 1)
            self.journal.pause()
        else:  # drained: every group in flight finishes and joins the order
            for future in list(self._units.values()):
                future.exception()
            with self._cv:
                while len(self._order) < len(self._units):
                    self._cv.wait(timeout=5.0)
        with self._cv:
            order = list(self._order)
            running = [u for u in self._units if u not in order]
        results = [self._units[u].result() for u in order]
        journal = self.journal
        partial: list[tuple[int, int, dict[int, list[dict[str, Any]]]]] = (
            [(u, self._attempt[u], journal.snapshot(self._key(u))) for u in running]
            if journal is not None else [])
        from vagent.distributed import gather_objects

        # a job's ranks each hold their own groups: every rank's, gathered
        parts = gather_objects(([[u, self._attempt[u], len(res)] for u, res in zip(order, results)],
                                [{k: float(v) for k, v in getattr(res, "metrics", {}).items()} for res in results],
                                [e for res in results for e in res], partial), "completion-order groups in flight")
        units = [u for us, _, _, _ in parts for u in us]
        metrics = [m for _, ms, _, _ in parts for m in ms]
        episodes = [e for _, _, es, _ in parts for e in es]
        partial = [p for _, _, _, ps in parts for p in ps]
        if not units and not partial:
            return None
        versions = _versions(episodes) + [v for _, _, rs in partial for v in reply_versions(rs)]
        newest = max(versions, default=None)
        step = self._taken + 1
        return [InFlight(step, min(min(versions, default=step), step), RolloutResult(episodes),
                         dict(self._sync.get(newest, {})) if newest is not None else {},
                         order={"units": units, "metrics": metrics, "running": [list(p) for p in partial],
                                "started": self._started})]

    def resume_in_flight(self, saved: InFlight | list[InFlight], step: int) -> None:
        """Take back the finished groups a checkpoint kept (``in_flight()``), in their order (a job's
        rank: those of its block)."""
        records = saved if isinstance(saved, list) else [saved]
        rec = records[0] if len(records) == 1 else None
        order = getattr(rec, "order", None)
        if rec is None or not isinstance(order, dict) or rec.step != step:
            raise ValueError(f"the checkpoint's in-flight rollouts are not a completion-order stream's groups for step "
                             f"{step} (rollout.batch_order completion): resume with the run's config.yaml")
        episodes, at = list(rec.episodes), 0
        metrics = list(order.get("metrics") or [{} for _ in order["units"]])
        for (unit, attempt, n), m in zip(order["units"], metrics):
            done: Future[RolloutResult] = Future()
            done.set_result(RolloutResult(episodes[at:at + n], dict(m)))
            at += n
            if int(unit) % self.n_groups not in self.own:
                continue  # another rank's group
            self._units[int(unit)], self._attempt[int(unit)] = done, int(attempt)
            self._order.append(int(unit))
        if at != len(episodes):
            raise ValueError(f"the checkpoint's in-flight groups list {at} episodes and hold {len(episodes)}: its "
                             "inflight.pt is damaged")
        for unit, attempt, replies in order.get("running") or []:
            if int(unit) % self.n_groups not in self.own:
                continue  # another rank's group
            if self.journal is None:
                raise ValueError("the checkpoint holds half-finished groups, which only a run whose policy generates "
                                 "through an HFPolicy (engine replicas) resumes; resume it with the run's config.yaml")
            self.journal.hold(replies, self._key(int(unit), int(attempt)))
            self._attempt[int(unit)] = int(attempt)
            self._resumed.append((int(unit), int(attempt)))
        self._started = int(order["started"])
        self._taken = step - 1
        newest = max(_versions(episodes), default=None)
        if rec.sync and newest is not None:
            self._sync.setdefault(newest, dict(rec.sync))

    def close(self) -> None:
        """Wait for the groups in flight (their results unused), then close as the streaming driver."""
        for future in list(self._units.values()):
            future.exception()
        self._units.clear()
        self._group_pool.shutdown(wait=True)
        super().close()


__all__ = ["CompletionDriver", "MAX_ATTEMPTS", "unit_gate_schedule"]
