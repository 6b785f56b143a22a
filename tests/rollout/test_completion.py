"""Batches formed in completion order (``rollout.batch_order: completion``,
``vagent.rollout.completion``), without Ray or a model: groups whose finish the test orders (each
waits on an event of its own, on real threads), a policy that answers with the engine's weights
version. The batch is the first groups to finish whatever their step; a group too stale is dropped
and played again (or kept); the schedule records which groups formed each batch and a replay takes
the same groups in the same order however the groups finish; a checkpoint keeps the finished
groups not yet taken, in order, and a resume takes them."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch

from vagent.envs.base import Observation
from vagent.envs.formats import ParsedResponse
from vagent.rollout.completion import CompletionDriver
from vagent.rollout.finish import RolloutResult
from vagent.rollout.policy import Conversation, Reply, SamplingConfig
from vagent.rollout.records import Episode, Turn
from vagent.rollout.schedule import ScheduleError, ScheduleLog, read_schedule

G, TURNS = 2, 2


class Engine:
    """Holds the weights version pushed to it."""

    def __init__(self) -> None:
        self.weights_version = -1

    def update_weights(self, model, version: int) -> None:
        self.weights_version = version


class Policy:
    """Answers each conversation with the engine's version (the gate holds a replayed turn first)."""

    def __init__(self, engine: Engine):
        self.engine = engine

    def act(self, conversations, sampling):
        return [Reply("r", weights_version=self.engine.weights_version) for _ in conversations]


class Groups:
    """The run's rollout of one group: it waits for the test's go (``release``), then plays
    ``TURNS`` turns of one trajectory; ``groups(step)`` = G."""

    cfg = None

    def __init__(self) -> None:
        self.go: dict[int, threading.Event] = {}
        self.lock = threading.Lock()

    def event(self, unit: int) -> threading.Event:
        with self.lock:
            return self.go.setdefault(unit, threading.Event())

    def groups(self, step: int) -> int:
        return G

    def __call__(self, policy, slot: int, unshard: bool, group: int | None = None) -> RolloutResult:
        unit = slot * G + group
        first = policy.act([Conversation(key=0)], SamplingConfig())[0]  # turn 0 samples at once
        assert self.event(unit).wait(20), f"group {unit} was never released"
        turns = [first] + [policy.act([Conversation(key=0)], SamplingConfig())[0] for _ in range(TURNS - 1)]
        ts = [Turn(index=i, observation=Observation("o"), reply="r", parsed=ParsedResponse(True), env_reward=0.0,
                   reward=float(unit), terminated=False, truncated=False, sampled_token_ids=[1],
                   weights_version=r.weights_version) for i, r in enumerate(turns)]
        return RolloutResult([Episode(env_name="corridor", env_config={}, seed=unit, group_id=0, traj_id=0,
                                      system_prompt="", turns=ts)], {"perf/rollout_time_s": 0.1})


def _driver(groups: Groups, k: int = 1, steps: int = 4, **kw) -> CompletionDriver:
    engine = Engine()
    driver = CompletionDriver(groups, Policy(engine), engine=engine, model=torch.nn.Linear(1, 1), max_staleness=k,
                              steps=steps, deadline_s=10.0, **kw)
    driver.start(push=True)
    return driver


def _get(driver: CompletionDriver, groups: Groups, step: int, release: list[int]) -> RolloutResult:
    """``driver.get(step)`` on a thread while the groups ``release`` finish one after another."""
    out: dict = {}
    t = threading.Thread(target=lambda: out.setdefault("v", driver.get(step)), daemon=True)
    t.start()
    for unit in release:
        attempt = driver._attempt.get(unit, 0)
        deadline = time.monotonic() + 10
        while unit not in driver._units and time.monotonic() < deadline:  # not started yet (a later slot)
            time.sleep(0.01)
        groups.event(unit).set()
        while (driver._attempt.get(unit) == attempt and unit in driver._units and unit not in driver._order
               and time.monotonic() < deadline):  # finished (or taken, or dropped and started again)
            time.sleep(0.01)
    t.join(10)
    assert "v" in out, f"get({step}) did not return"
    return out["v"]


def _units(batch: RolloutResult) -> list[int]:
    return [e.seed for e in batch]


def _play(groups: Groups, driver: CompletionDriver) -> list[RolloutResult]:
    """Step 0 takes groups 1, 2 (group 0, of step 0, is slow); step 1 groups 3, 4; at step 2 group 0
    finishes, sampled 2 updates ago (K = 1), with 5 and a group of the newest slot."""
    b0 = _get(driver, groups, 0, [1, 2])
    b1 = _get(driver, groups, 1, [3, 4])
    b2 = _get(driver, groups, 2, [0, 5])
    return [b0, b1, b2]


def test_a_batch_is_the_first_groups_to_finish_and_a_too_stale_one_is_played_again(tmp_path: Path):
    groups = Groups()
    driver = _driver(groups, log=ScheduleLog(tmp_path, "d", 1))
    try:
        b0, b1, b2 = _play(groups, driver)
        assert _units(b0) == [1, 2] and _units(b1) == [3, 4]
        assert [e.group_id for e in b0] == [0, 1] and [e.traj_id for e in b0] == [0, 1]  # numbered as taken
        assert b0.metrics["rollout/other_slot_frac"] == 0.5  # group 2 is step 1's
        # group 0 (version 0) at step 2 is 2 updates old: dropped, played again on weights 2
        assert b2.metrics["rollout/dropped"] == 1.0
        assert sorted(_units(b2)) == [0, 5] and b2.metrics["rollout/staleness_max"] <= 1
        assert [t.weights_version for e in b2 if e.seed == 0 for t in e.turns] == [2, 2]
    finally:
        for e in list(groups.go.values()):
            e.set()
        driver.close()
    recorded = read_schedule(tmp_path)
    assert recorded.batches[0]["units"] == [(1, 0), (2, 0)] and recorded.batches[1]["units"] == [(3, 0), (4, 0)]
    assert [d[:2] for d in recorded.batches[2]["dropped"]] == [(0, 0)]
    assert recorded.batches[2]["dropped"][0][2] == {0: [0, 2]}  # its turns: before the slow wait, after push 2


def test_keep_trains_a_too_stale_group_and_says_how_stale():
    groups = Groups()
    driver = _driver(groups, too_stale="keep")
    try:
        b0, b1, b2 = _play(groups, driver)
        assert _units(b2) == [0, 5] and b2.metrics["rollout/dropped"] == 0.0
        assert b2.metrics["rollout/staleness_max"] == 2.0  # over K = 1: kept, the decoupled loss corrects it
    finally:
        for e in list(groups.go.values()):
            e.set()
        driver.close()


def test_a_replay_takes_the_recorded_groups_in_the_recorded_order_however_they_finish(tmp_path: Path):
    groups = Groups()
    (tmp_path / "a").mkdir()
    driver = _driver(groups, log=ScheduleLog(tmp_path / "a", "d", 1))
    try:
        first = _play(groups, driver)
    finally:
        for e in list(groups.go.values()):
            e.set()
        driver.close()
    # every group released at once: free, the batches would be whatever finished first
    again = Groups()
    for u in range(8):
        again.event(u).set()
    (tmp_path / "b").mkdir()
    replay = _driver(again, replay=read_schedule(tmp_path / "a"), log=ScheduleLog(tmp_path / "b", "d", 1))
    try:
        got = [replay.get(s) for s in range(3)]
    finally:
        replay.close()
    assert [_units(b) for b in got] == [_units(b) for b in first]
    assert [[t.weights_version for e in b for t in e.turns] for b in got] == \
        [[t.weights_version for e in b for t in e.turns] for b in first]
    assert got[2].metrics["rollout/dropped"] == 1.0
    assert read_schedule(tmp_path / "b").batches == read_schedule(tmp_path / "a").batches


def test_a_checkpoint_keeps_the_finished_groups_in_order_and_a_resume_takes_them():
    groups = Groups()
    driver = _driver(groups)
    try:
        _get(driver, groups, 0, [3, 1])
        for u in (2, 0):  # finish in this order while nothing is taken
            groups.event(u).set()
            while u not in driver._order:
                time.sleep(0.01)
        saved = driver.in_flight()
    finally:
        for e in list(groups.go.values()):
            e.set()
        driver.close()
    assert len(saved) == 1 and saved[0].step == 1 and saved[0].order["units"] == [[2, 0, 1], [0, 0, 1]]
    assert saved[0].order["metrics"] == [{"perf/rollout_time_s": 0.1}] * 2
    assert saved[0].order["started"] == 1
    fresh = Groups()
    resumed = _driver(fresh, steps=2)
    try:
        resumed.resume_in_flight(saved, 1)
        resumed.engine.weights_version = 1  # as update 1's push leaves it (a resumed trainer pushes its weights)
        batch = resumed.get(1)
        assert _units(batch) == [2, 0]  # taken as they finished, without playing them again
        assert batch.metrics["perf/rollout_time_s"] == 0.1  # with their own rollouts' metrics
        assert fresh.go == {}  # no group of the resumed run was released: none was needed
        with pytest.raises(ValueError, match="not a completion-order stream's groups for step 3"):
            resumed.resume_in_flight(saved, 3)
    finally:
        resumed.close()


def test_a_replay_that_takes_a_group_the_run_never_started_is_refused(tmp_path: Path):
    (tmp_path / "rollout_schedule.jsonl").write_text(
        '{"schedule": 1, "config": "d", "max_staleness": 1}\n'
        '{"step": 0, "versions": {"0": [0], "1": [0]}, "units": [[40, 0], [1, 0]], "dropped": []}\n')
    groups = Groups()
    for u in range(4):
        groups.event(u).set()
    driver = _driver(groups, replay=read_schedule(tmp_path))
    try:
        with pytest.raises(ScheduleError, match="the record takes group 40, which this run has not started"):
            driver.get(0)
    finally:
        driver.close()
