"""The schedule of a streaming rollout: which weights version sampled each turn, recorded as it
happens and replayed on demand (``rollout.max_staleness``, ``rollout.replay_schedule``).

A streaming run (:mod:`vagent.rollout.streaming`) pushes the trainer's weights while
trajectories are in flight, so a trajectory's turns can be sampled by different versions. Which
turn got which version depends on timing (how fast each env step and reply came back); every
other input of a turn is fixed by the run's seeds. So the schedule below, together with the
config, determines the run:

- ``<run>/rollout_schedule.jsonl``: a header line ``{"schedule": 1, "config": DIGEST,
  "max_staleness": K}``, then one line per batch the trainer took, in order: ``{"step": s,
  "versions": {"<traj_id>": [v_turn0, v_turn1, ...]}}`` (``s`` = updates done when it was taken).
  Written and flushed at each take, so a killed run keeps every batch it trained on.
- :class:`VersionGate` replays a recorded schedule: each turn waits until the generator holds its
  recorded version, and a push of version ``v`` waits until every recorded turn of an older
  version in the rollouts started so far has been sampled. Turns the record does not list (steps
  after the recorded run's end) run free.

``DIGEST`` (:func:`schedule_digest`) covers what decides the episodes: the seed, the recipe, the
envs and the rollout section (without the replay path and the deadlines); a replay under another
config is refused before any model work (:func:`replay_problem`).
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Container, Mapping, Sequence

from vagent.rollout.policy import Conversation, Policy, Reply, SamplingConfig
from vagent.rollout.records import Episode

SCHEDULE_FILE = "rollout_schedule.jsonl"
FORMAT = 1
#: rollout settings that do not change which episodes a schedule produces
_FREE = ("replay_schedule", "push_timeout_s", "generate_timeout_s")
#: env entry settings that do not either (deadlines of env-server calls)
_FREE_ENV = ("timeout_s", "retry_timeout_s")


class ScheduleError(RuntimeError):
    """A recorded schedule that cannot be replayed (another config, a diverged replay, a wait past
    its deadline)."""


def schedule_digest(config: Mapping[str, Any]) -> str:
    """The sha256 (16 hex digits) of what decides a streaming run's episodes besides its schedule,
    from the run config as a mapping (``dataclasses.asdict(cfg)``)."""
    rollout = {k: v for k, v in dict(config["rollout"]).items() if k not in _FREE}
    envs = [{k: v for k, v in dict(e).items() if k not in _FREE_ENV} for e in config["envs"]]
    key = {"seed": config["seed"], "recipe": config["recipe"], "envs": envs, "rollout": rollout}
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]


def turn_versions(episodes: Sequence[Episode]) -> dict[int, list[int]]:
    """``{traj_id: [the version of each turn]}`` of a batch (turns without a version: -1)."""
    return {e.traj_id: [t.weights_version if t.weights_version is not None else -1 for t in e.turns]
            for e in episodes}


@dataclass(frozen=True)
class RecordedSchedule:
    """A schedule file read back: its header's config digest and staleness bound, and per step the
    versions of each trajectory's turns."""

    path: str
    digest: str
    max_staleness: int
    steps: dict[int, dict[int, list[int]]]
    #: per step of a completion-order run: the batch's groups and the groups dropped as too stale
    #: (``{"units": [[unit, attempt], ...], "dropped": [[unit, attempt, {member: versions}], ...]}``)
    batches: dict[int, dict[str, Any]] = field(default_factory=dict)


def _schedule_path(source: str | Path) -> Path:
    p = Path(source)
    return p / SCHEDULE_FILE if p.is_dir() else p


def read_schedule(source: str | Path) -> RecordedSchedule:
    """The schedule of a run directory (or of a ``rollout_schedule.jsonl`` path); a missing or
    damaged file is a one-line ScheduleError naming it."""
    path = _schedule_path(source)
    if not path.is_file():
        raise ScheduleError(f"rollout.replay_schedule {source}: no {SCHEDULE_FILE} there; give the run directory "
                            "of a streaming run (rollout.max_staleness >= 1), which records one as it trains")
    lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
    try:
        header = json.loads(lines[0]) if lines else {}
        if header.get("schedule") != FORMAT:
            raise ValueError(f"the header line is not {{\"schedule\": {FORMAT}, ...}}")
        steps: dict[int, dict[int, list[int]]] = {}
        batches: dict[int, dict[str, Any]] = {}
        for ln in lines[1:]:
            rec = json.loads(ln)
            steps[int(rec["step"])] = {int(k): [int(v) for v in vs] for k, vs in rec["versions"].items()}
            if "units" in rec:
                batches[int(rec["step"])] = {
                    "units": [(int(u), int(a)) for u, a in rec["units"]],
                    "dropped": [(int(u), int(a), {int(m): [int(v) for v in vs] for m, vs in d.items()})
                                for u, a, d in rec.get("dropped", [])]}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ScheduleError(f"{path} is not a rollout schedule vagent wrote ({exc}); give the run directory of a "
                            "streaming run") from None
    k = int(header.get("max_staleness", 0))
    for step, trajs in steps.items():  # a turn of step s's batch is sampled by weights s - K .. s, or never
        low = 0 if step in batches else max(0, step - k)  # a completion-order batch may keep older groups
        bad = next(((t, v) for t, vs in trajs.items() for v in vs if not low <= v <= step), None)
        if bad is not None:
            raise ScheduleError(f"{path}: step {step}'s trajectory {bad[0]} has a turn sampled by weights {bad[1]}, "
                                f"outside {low}..{step} (the batch of step {step} is taken after {step} "
                                f"updates and holds tokens at most max_staleness={k} updates old)")
    return RecordedSchedule(str(path), str(header.get("config")), k, steps, batches)


def replay_problem(source: str | Path, digest: str) -> str | None:
    """None when ``source`` (``rollout.replay_schedule``) holds a schedule recorded under a config
    of this ``digest`` (:func:`schedule_digest`); else one line saying why not and how to fix it."""
    try:
        recorded = read_schedule(source)
    except ScheduleError as exc:
        return str(exc)
    if recorded.digest != digest:
        return (f"rollout.replay_schedule {source} was recorded under another config (its digest {recorded.digest}, "
                f"this config's {digest}: the seed, recipe, envs and rollout section must be those of the recorded "
                "run); replay it with that run's config.yaml")
    return None


def _step_of(line: str) -> float:
    """The step of a schedule record line (inf for a blank, damaged or cut line: it is not kept)."""
    try:
        return float(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return float("inf")


class ScheduleLog:
    """Appends each taken batch's turn versions to ``<run>/rollout_schedule.jsonl`` (see the module
    docstring). ``resume_at``: the records of steps at or after it (a killed run's batches the
    resumed run takes again) are cut from the file first."""

    def __init__(self, run_root: str | Path, digest: str, max_staleness: int, resume_at: int | None = None):
        self.path = Path(run_root) / SCHEDULE_FILE
        kept: list[str] = []
        if resume_at is not None and self.path.is_file():  # a line cut by a kill mid-write is dropped
            kept = [ln for ln in self.path.read_text().splitlines()[1:] if _step_of(ln) < resume_at]
        header = json.dumps({"schedule": FORMAT, "config": digest, "max_staleness": max_staleness})
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text("".join(ln + "\n" for ln in [header, *kept]))
        tmp.replace(self.path)

    def record(self, step: int, episodes: Sequence[Episode], extra: Mapping[str, Any] | None = None) -> None:
        """Append step ``step``'s batch: its turn versions, and ``extra`` (a completion-order batch's
        ``units`` and ``dropped``, :mod:`vagent.rollout.completion`)."""
        line = json.dumps({"step": step, "versions": {str(k): v for k, v in turn_versions(episodes).items()},
                           **dict(extra or {})})
        with self.path.open("a") as f:
            f.write(line + "\n")
            f.flush()


class VersionGate:
    """Holds each turn and each push to a recorded schedule (see the module docstring).

    ``deadline_s``: the longest a turn or a push waits; past it the replay has diverged (an episode
    the record lists ended earlier, or a turn sampled with another version) and ScheduleError says
    where."""

    def __init__(self, recorded: RecordedSchedule, version: int, deadline_s: float = 1800.0):
        self.recorded, self.deadline_s = recorded, deadline_s
        self._cv = threading.Condition()
        self._version = version
        self._pending: dict[tuple[int, int, int], int] = {}  # (step, traj, turn) -> recorded version

    def started(self, step: int, trajs: Container[int] | None = None) -> None:
        """Rollout ``step`` started: its recorded turns are now owed before a newer push (only
        those of ``trajs``: the trajectories this rank of a job plays; None: every one)."""
        with self._cv:
            for traj, versions in self.recorded.steps.get(step, {}).items():
                if trajs is not None and traj not in trajs:
                    continue
                for turn, v in enumerate(versions):
                    self._pending[(step, traj, turn)] = v

    def finished(self, step: int) -> None:
        """Rollout ``step`` ended: turns of it the record lists and the replay did not sample are
        owed no more (the replay diverged; the take's check says where)."""
        with self._cv:
            for key in [k for k in self._pending if k[0] == step]:
                del self._pending[key]
            self._cv.notify_all()

    def _wait(self, ready: object, what: str) -> None:
        end = time.monotonic() + self.deadline_s
        while not ready():  # type: ignore[operator]
            left = end - time.monotonic()
            if left <= 0:
                raise ScheduleError(f"replaying {self.recorded.path}: {what} waited {self.deadline_s:g} s; the replay "
                                    "diverged from the record (another model, config or vagent version)")
            self._cv.wait(timeout=min(left, 5.0))

    def before_turn(self, step: int, traj: int, turn: int) -> None:
        """Wait until the generator holds the version the record gives this turn."""
        v = self.recorded.steps.get(step, {}).get(traj, [])
        if turn >= len(v):
            return
        with self._cv:
            self._wait(lambda: self._version >= v[turn],
                       f"turn {turn} of trajectory {traj} (rollout of step {step}) for weights {v[turn]}")

    def after_turn(self, step: int, traj: int, turn: int) -> None:
        with self._cv:
            if self._pending.pop((step, traj, turn), None) is not None:
                self._cv.notify_all()

    def before_push(self, version: int) -> None:
        """Wait until every started turn the record samples with an older version has been sampled."""
        with self._cv:
            self._wait(lambda: all(v >= version for v in self._pending.values()), f"the push of weights {version}")

    def pushed(self, version: int) -> None:
        with self._cv:
            self._version = version
            self._cv.notify_all()


class GatedPolicy:
    """The generator's policy for one rollout of a replayed schedule: each conversation's turn
    waits for its recorded version (``VersionGate``); turns are counted per trajectory (the
    conversation's ``key`` plus ``offset``: a job's rank numbers its own trajectories from 0, and
    the record numbers them as one process does, from its first spec's)."""

    def __init__(self, inner: Policy, gate: VersionGate, step: int, offset: int = 0):
        self.inner, self.gate, self.step, self.offset = inner, gate, step, offset
        self._turns: dict[int, int] = {}
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> object:  # thread_safe, per_request_seeds, engine, ...
        return getattr(self.inner, name)

    def act(self, conversations: Sequence[Conversation], sampling: SamplingConfig) -> list[Reply]:
        with self._lock:
            turns = []
            for c in conversations:
                key = int(c.key) + self.offset if c.key is not None else -1
                turns.append((key, self._turns.get(key, 0)))
                self._turns[key] = turns[-1][1] + 1
        for key, turn in turns:
            self.gate.before_turn(self.step, key, turn)
        try:
            return self.inner.act(conversations, sampling)
        finally:
            for key, turn in turns:
                self.gate.after_turn(self.step, key, turn)


def diverged(recorded: Mapping[int, list[int]], taken: Mapping[int, list[int]]) -> str | None:
    """None when every turn of a replayed batch that the record lists was sampled with the recorded
    version; else the first trajectory where one was not. (An episode may end before or after the
    record's turns: its length is the episode's, a turn beyond the record runs free.)"""
    for traj in sorted(set(recorded) | set(taken)):
        a, b = recorded.get(traj, []), taken.get(traj, [])
        n = min(len(a), len(b))
        if a[:n] != b[:n]:
            return f"trajectory {traj}: recorded versions {a}, replayed {b}"
    return None


__all__ = ["SCHEDULE_FILE", "GatedPolicy", "RecordedSchedule", "ScheduleError", "ScheduleLog", "VersionGate",
           "diverged", "read_schedule", "replay_problem", "schedule_digest", "turn_versions"]
