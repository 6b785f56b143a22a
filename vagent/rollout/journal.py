"""The replies of a streaming run's rollouts in flight, kept as they come, so that a checkpoint
holds half-finished trajectories instead of waiting for them (``rollout.max_staleness``).

A trajectory is determined by its env seed, its turn seeds and the replies its policy got: the
env replays the same observations for the same actions (every vagent env and the env service are
seeded), and the policy's conversation is rebuilt by encoding the same messages and appending the
same sampled tokens. So a trajectory in flight is checkpointed as the engine outputs it got so far,
in order, as plain data (``{"token_ids", "logprobs", "finish_reason", "text", "weights_version",
"token_versions"}``: no class of vagent's in the pickle), and resumed by running it again from its
reset with those outputs served instead of generated: its env steps replay its actions, and its
next reply is the first one generated.

- :class:`ReplyJournal` is the run's: it records every output of every rollout in flight (per step,
  per trajectory key, in order) and holds a pause. ``pause()`` blocks every new generate call and
  waits for the ones running to return (and be recorded): the moment a checkpoint snapshots the
  journal. The pause lasts until ``release()``, which the streaming driver calls right after its
  next push, so every turn after a checkpoint samples with the weights the checkpoint saved (or
  newer) in the uninterrupted run as in a resumed one, which has no older weights to sample with.
- :class:`JournalEngine` is one rollout's engine: the policy's engine behind the journal, serving a
  checkpoint's outputs for the turns it holds and recording the rest.

Every request must carry its trajectory key (the rollout sets it: ``Conversation.key``); one
without is an error, not a trajectory a checkpoint would silently lose.
"""

from __future__ import annotations

import copy
import threading
from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:  # torch: `import vagent.rollout` stays light
    from vagent.models.generation import GenerationOutput, GenerationRequest, SamplingParams

#: the fields of a journaled output (``GenerationOutput``'s), as plain data
FIELDS = ("token_ids", "logprobs", "finish_reason", "text", "weights_version", "token_versions")


def as_record(out: GenerationOutput) -> dict[str, Any]:
    """An engine output as plain data (lists, numbers, strings: what a weights-only load reads)."""
    rec = {k: getattr(out, k, None) for k in FIELDS}
    rec["token_ids"], rec["logprobs"] = [int(t) for t in out.token_ids], [float(x) for x in out.logprobs]
    if rec["token_versions"] is not None:
        rec["token_versions"] = [int(v) for v in rec["token_versions"]]
    return rec


def from_record(rec: dict[str, Any]) -> GenerationOutput:
    """A journaled output back as the engine's output; a record missing a field is a ValueError."""
    missing = [k for k in ("token_ids", "logprobs", "finish_reason", "text") if k not in rec]
    if missing:
        raise ValueError(f"a journaled reply lacks {missing}: the checkpoint's inflight.pt is damaged or not vagent's")
    from vagent.models.generation import GenerationOutput

    return GenerationOutput(list(rec["token_ids"]), list(rec["logprobs"]), str(rec["finish_reason"]), str(rec["text"]),
                            rec.get("weights_version"), rec.get("token_versions"))


def reply_versions(replies: dict[int, list[dict[str, Any]]]) -> list[int]:
    """The weights versions of a journal's records (``{key: [record, ...]}``) that carry one."""
    return [int(r["weights_version"]) for rs in replies.values() for r in rs if r.get("weights_version") is not None]


def on_engine(policy: Any, engine: Any) -> Any:
    """A shallow copy of ``policy`` (an HFPolicy: it shares the encoder and its lock) generating on
    ``engine``: one rollout's policy on that rollout's journaled (or re-keyed) engine."""
    out = copy.copy(policy)
    out.engine = engine
    return out


class ReplyJournal:
    """Every generated output of the rollouts in flight, and the pause a checkpoint takes (see
    the module docstring). ``saved``: a checkpoint's journals to serve, ``{step: {key: [record]}}``."""

    def __init__(self, saved: dict[int, dict[int, list[dict[str, Any]]]] | None = None):
        self._cv = threading.Condition()
        self._paused = False
        self._running = 0  # generate calls under way
        self._records: dict[int, dict[int, list[dict[str, Any]]]] = {}
        self._saved = {s: {int(k): list(v) for k, v in d.items()} for s, d in (saved or {}).items()}

    def hold(self, saved: dict[int, list[dict[str, Any]]], step: int) -> None:
        """Serve ``saved`` (a checkpoint's journal of rollout ``step``) to that rollout's first turns."""
        with self._cv:
            self._saved[step] = {int(k): list(v) for k, v in saved.items()}

    def engine(self, inner: Any, step: int) -> JournalEngine:
        """Rollout ``step``'s engine: ``inner`` behind this journal (its records start empty)."""
        with self._cv:
            self._records[step] = {}
        return JournalEngine(inner, self, step)

    def _served(self, step: int, key: int | None, n: int) -> dict[str, Any] | None:
        held = self._saved.get(step, {}).get(key) if key is not None else None
        return held[n] if held is not None and n < len(held) else None

    def _enter(self) -> None:
        with self._cv:
            while self._paused:
                self._cv.wait()
            self._running += 1

    def _leave(self) -> None:
        with self._cv:
            self._running -= 1
            self._cv.notify_all()

    def _record(self, step: int, key: int, n: int, rec: dict[str, Any]) -> None:
        with self._cv:
            replies = self._records.setdefault(step, {}).setdefault(key, [])
            if len(replies) != n:
                raise RuntimeError(f"the reply journal of rollout {step} got turn {n} of trajectory {key} after "
                                   f"{len(replies)} turns: two trajectories share a key. Report this with the "
                                   "run's train.log.")
            replies.append(rec)

    def pause(self) -> None:
        """Hold every new generate call and wait for the running ones to return (and be recorded)."""
        with self._cv:
            self._paused = True
            while self._running:
                self._cv.wait()

    def release(self) -> None:
        """Let generate calls run again (the streaming driver: after its next push)."""
        with self._cv:
            self._paused = False
            self._cv.notify_all()

    @property
    def paused(self) -> bool:
        return self._paused

    def snapshot(self, step: int) -> dict[int, list[dict[str, Any]]]:
        """Rollout ``step``'s replies so far, ``{trajectory key: [record, ...]}`` (a copy)."""
        with self._cv:
            return copy.deepcopy(self._records.get(step, {}))

    def forget(self, step: int) -> None:
        """Rollout ``step`` was taken: its records and saved replies are not needed any more."""
        with self._cv:
            self._records.pop(step, None)
            self._saved.pop(step, None)


class JournalEngine:
    """The engine of one rollout in flight: serves a checkpoint's outputs for the turns it holds,
    generates the others on ``inner`` (waiting out a pause), and records every output."""

    def __init__(self, inner: Any, journal: ReplyJournal, step: int):
        self.inner, self.journal, self.step = inner, journal, step
        self._turns: dict[int | None, int] = {}
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:  # thread_safe, needs_images, stats, weights_version, ...
        return getattr(self.inner, name)

    def generate(self, requests: Sequence[GenerationRequest], params: SamplingParams) -> list[GenerationOutput]:
        if any(getattr(req, "key", None) is None for req in requests):
            raise ValueError("a streaming rollout's request has no trajectory key (GenerationRequest.key): the reply "
                             "journal keys each trajectory's replies by it, so a checkpoint can keep them. Build the "
                             "requests from the rollout's conversations (Conversation.key)")
        with self._lock:
            turns = []
            for req in requests:
                key = getattr(req, "key", None)
                turns.append((key, self._turns.get(key, 0)))
                self._turns[key] = turns[-1][1] + 1
        outputs: list[GenerationOutput | None] = [None] * len(requests)
        live = []
        for i, (key, n) in enumerate(turns):
            held = self.journal._served(self.step, key, n)
            if held is not None:
                outputs[i] = from_record(held)
            else:
                live.append(i)
        self.journal._enter()  # served turns too: a snapshot never misses a turn that was handed out
        try:
            if live:
                generated = self.inner.generate([requests[i] for i in live], params)
                if len(generated) != len(live):
                    raise RuntimeError(f"engine returned {len(generated)} outputs for {len(live)} requests")
                for i, out in zip(live, generated):
                    outputs[i] = out
            self._record_all(turns, outputs)
        finally:
            self.journal._leave()
        return outputs  # type: ignore[return-value]

    def _record_all(self, turns: list[tuple[int | None, int]], outputs: list[GenerationOutput | None]) -> None:
        for (key, n), out in zip(turns, outputs):
            if out is not None and key is not None:
                self.journal._record(self.step, key, n, as_record(out))


__all__ = ["FIELDS", "JournalEngine", "ReplyJournal", "as_record", "from_record", "on_engine", "reply_versions"]
