"""The reply journal that lets a streaming checkpoint keep half-finished trajectories
(``vagent.rollout.journal``): a rollout run again from its resets with a checkpoint's replies
served gives the uninterrupted rollout's episodes (tiny VLM, sampled, FrozenLake), generating only
the turns the checkpoint did not hold; the pause holds new generate calls and waits for the running
ones; a checkpoint's records are plain data."""

from __future__ import annotations

import copy
import io
import threading
import time

import pytest
import torch

from tests.rollout.test_async import CFG, SAMPLED, slow_factory, summary
from vagent.rollout import EnvSpec, HFPolicy, rollout
from vagent.rollout.journal import ReplyJournal, as_record, from_record


def _journaled(policy: HFPolicy, journal: ReplyJournal, step: int) -> HFPolicy:
    """As the streaming driver runs a rollout in flight: the policy on the journal's engine."""
    p = copy.copy(policy)
    p.engine = journal.engine(policy.engine, step)
    return p


def _run(policy: HFPolicy, n: int = 4):
    return rollout([EnvSpec("frozenlake", CFG, seed) for seed in range(n)], policy, SAMPLED, group_size=1,
                   max_turns=3, env_factory=slow_factory, schedule="async")


def test_a_rollout_resumed_from_its_journal_equals_the_uninterrupted_one(loaded):
    policy = HFPolicy(loaded, per_request_seeds=True, batching=True)
    try:
        journal = ReplyJournal()
        full = _run(_journaled(policy, journal, 7))
        records = journal.snapshot(7)
        turns = {e.traj_id: len(e.turns) for e in full}
        assert sum(turns.values()) >= 6 and sorted(records) == sorted(turns)
        assert all(len(records[k]) == turns[k] for k in turns), (records, turns)

        # a checkpoint caught each trajectory after its first reply (a 1-turn one: finished, or about to step)
        held = {k: v[:1] for k, v in records.items()}
        saved = torch.load(io.BytesIO(_saved_bytes(held)), weights_only=True)  # plain data: a weights-only load
        before = policy.engine.stats["requests"]
        resumed = ReplyJournal()
        resumed.hold(saved, 7)
        again = _run(_journaled(policy, resumed, 7))
        assert summary(again) == summary(full)
        # the log-probs too (within ~1e-7: they vary with which requests share the engine's batch)
        flat = [(lp_a, lp_b) for ea, eb in zip(again, full) for ta, tb in zip(ea.turns, eb.turns)
                for lp_a, lp_b in zip(ta.sampled_logprobs, tb.sampled_logprobs)]
        assert flat and max(abs(a - b) for a, b in flat) < 1e-5
        generated = policy.engine.stats["requests"] - before
        assert generated == sum(turns.values()) - len(turns), "served turns were generated again"
        # served turns are journaled too: a second checkpoint keeps them
        tokens = {k: [r["token_ids"] for r in v] for k, v in records.items()}
        assert {k: [r["token_ids"] for r in v] for k, v in resumed.snapshot(7).items()} == tokens
        assert resumed.snapshot(7)[0][0] == records[0][0]  # a served reply exactly as saved

        # without the served replies the same seeds give the same rollout only by generating all of it
        before = policy.engine.stats["requests"]
        assert summary(_run(_journaled(policy, ReplyJournal(), 7))) == summary(full)
        assert policy.engine.stats["requests"] - before == sum(turns.values())
    finally:
        policy.engine.close()


def _saved_bytes(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


class _Clock:
    """An engine whose replies take ``delay_s`` and name their key and turn (to watch the pause)."""

    thread_safe = True

    def __init__(self, delay_s: float):
        self.delay_s, self.calls = delay_s, 0

    def generate(self, requests, params):
        from vagent.models.generation import GenerationOutput

        self.calls += 1
        time.sleep(self.delay_s)
        return [GenerationOutput([1, 2], [-0.5, -0.25], "eos", f"k{r.key}", weights_version=3) for r in requests]


def _request(key: int):
    from vagent.models.generation import GenerationRequest

    return GenerationRequest([1, 2, 3], None, None, key=key)


def test_the_pause_waits_for_running_replies_and_holds_new_ones_until_released():
    inner = _Clock(0.3)
    journal = ReplyJournal()
    engine = journal.engine(inner, 2)
    running = threading.Thread(target=engine.generate, args=([_request(5)], None))
    running.start()
    time.sleep(0.1)  # under way
    t0 = time.monotonic()
    journal.pause()
    assert time.monotonic() - t0 > 0.1, "the pause did not wait for the reply being generated"
    assert journal.snapshot(2) == {5: [as_record(inner.generate([_request(5)], None)[0])]}
    inner.calls = 0
    held = threading.Thread(target=engine.generate, args=([_request(6)], None))
    held.start()
    time.sleep(0.5)
    assert held.is_alive() and inner.calls == 0, "a generate call ran during the pause"
    journal.release()
    held.join(5.0)
    assert not held.is_alive() and inner.calls == 1 and sorted(journal.snapshot(2)) == [5, 6]
    running.join(5.0)


def test_a_journal_refuses_two_trajectories_on_one_key_and_a_request_without_a_key():
    journal = ReplyJournal()
    first, second = journal.engine(_Clock(0.0), 1), journal.engine(_Clock(0.0), 1)
    first.generate([_request(3)], None)
    with pytest.raises(RuntimeError, match="got turn 0 of trajectory 3 after 1 turns: two trajectories share a key"):
        second.generate([_request(3)], None)
    from vagent.models.generation import GenerationRequest

    with pytest.raises(ValueError, match="a streaming rollout's request has no trajectory key"):
        first.generate([GenerationRequest([1], None, None)], None)
    assert journal.snapshot(1) == {3: [as_record(_Clock(0.0).generate([_request(3)], None)[0])]}


def test_a_journaled_reply_round_trips_as_plain_data_and_a_damaged_one_is_named():
    out = _Clock(0.0).generate([_request(1)], None)[0]
    rec = as_record(out)
    assert all(type(v) in (list, str, int, type(None)) for v in rec.values())
    assert from_record(rec) == out
    with pytest.raises(ValueError, match=r"a journaled reply lacks \['text'\]"):
        from_record({k: v for k, v in rec.items() if k != "text"})
