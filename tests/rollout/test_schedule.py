"""The streaming rollout's schedule and driver bookkeeping, without Ray or a model.

``vagent.rollout.schedule``: the schedule file read back (refused in one line when missing,
damaged or impossible), ``diverged``, the ``VersionGate`` that holds turns and pushes to a
recorded schedule (real threads, short deadlines), ``ScheduleLog`` and ``GatedPolicy``.
``vagent.rollout.streaming``: the batch staleness metrics and the in-flight records a resume
hands back.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from vagent.envs.base import Observation
from vagent.envs.formats import ParsedResponse
from vagent.rollout.driver import InFlight
from vagent.rollout.finish import RolloutResult
from vagent.rollout.policy import Conversation, SamplingConfig
from vagent.rollout.records import Episode, Turn
from vagent.rollout.schedule import (
    SCHEDULE_FILE, GatedPolicy, RecordedSchedule, ScheduleError, ScheduleLog, VersionGate, diverged, read_schedule,
    turn_versions,
)
from vagent.rollout.scripted import ScriptedPolicy
from vagent.rollout.streaming import StreamingDriver, staleness

#: how long a thread that should be held is watched; how long one that should go is waited for
HELD_S, GOES_S = 0.3, 5.0


def _episode(traj: int, versions: list[int | None], tokens: list[int] | None = None) -> Episode:
    tokens = tokens or [3] * len(versions)
    turns = [Turn(index=i, observation=Observation("o"), reply="r", parsed=ParsedResponse(True), env_reward=0.0,
                  reward=0.0, terminated=False, truncated=False, sampled_token_ids=list(range(n)), weights_version=v)
             for i, (v, n) in enumerate(zip(versions, tokens))]
    return Episode(env_name="corridor", env_config={}, seed=traj, group_id=traj, traj_id=traj, system_prompt="",
                   turns=turns)


def _write(path: Path, *lines: object) -> Path:
    path.write_text("".join((ln if isinstance(ln, str) else json.dumps(ln)) + "\n" for ln in lines))
    return path


def _start(fn, *args) -> tuple[threading.Thread, dict]:
    """``fn(*args)`` on a thread of its own; the dict gets its ``value`` or ``error``."""
    out: dict = {}

    def target() -> None:
        try:
            out["value"] = fn(*args)
        except BaseException as exc:  # noqa: BLE001 -- handed to the test
            out["error"] = exc

    t = threading.Thread(target=target, daemon=True)
    t.start()
    return t, out


def _held(t: threading.Thread) -> bool:
    t.join(HELD_S)
    return t.is_alive()


def _went(t: threading.Thread, out: dict) -> bool:
    t.join(GOES_S)
    if "error" in out:
        raise out["error"]
    return not t.is_alive()


# --- read_schedule ----------------------------------------------------------------------------


def test_a_missing_schedule_is_refused_in_one_line_naming_it(tmp_path):
    for source in (tmp_path, tmp_path / "elsewhere" / SCHEDULE_FILE):
        with pytest.raises(ScheduleError) as info:
            read_schedule(source)
        msg = str(info.value)
        assert "\n" not in msg and str(source) in msg and f"no {SCHEDULE_FILE} there" in msg, msg
        assert "give the run directory of a streaming run" in msg


@pytest.mark.parametrize("lines", [
    [],
    ["not json"],
    [{"schedule": 2, "config": "abc", "max_staleness": 1}],
    [{"schedule": 1, "config": "abc", "max_staleness": 1}, {"step": 0}],
    [{"schedule": 1, "config": "abc", "max_staleness": 1}, {"step": 0, "versions": {"0": [0]}}, '{"step": 1, "vers'],
    [{"schedule": 1, "config": "abc", "max_staleness": 1}, {"step": 0, "versions": {"0": ["x"]}}],
], ids=["empty", "not-json", "other-format", "no-versions", "cut-line", "not-a-version"])
def test_a_damaged_schedule_is_refused_in_one_line_naming_it(tmp_path, lines):
    path = _write(tmp_path / SCHEDULE_FILE, *lines)
    with pytest.raises(ScheduleError) as info:
        read_schedule(tmp_path)
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(f"{path} is not a rollout schedule vagent wrote"), msg
    assert "give the run directory of a streaming run" in msg


@pytest.mark.parametrize("version", [1, 4], ids=["older-than-K", "newer-than-the-step"])
def test_a_turn_version_outside_the_staleness_window_is_refused(tmp_path, version):
    path = _write(tmp_path / SCHEDULE_FILE, {"schedule": 1, "config": "abc", "max_staleness": 1},
                  {"step": 3, "versions": {"6": [2, 3], "7": [2, version]}})
    with pytest.raises(ScheduleError) as info:
        read_schedule(path)
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(str(path)), msg
    assert f"step 3's trajectory 7 has a turn sampled by weights {version}, outside 2..3" in msg
    assert "max_staleness=1" in msg


def test_a_negative_turn_version_is_refused(tmp_path):
    path = _write(tmp_path / SCHEDULE_FILE, {"schedule": 1, "config": "abc", "max_staleness": 1},
                  {"step": 0, "versions": {"0": [-1]}})
    with pytest.raises(ScheduleError, match="outside 0..0"):
        read_schedule(path)


def test_a_schedule_reads_back_what_the_log_recorded_and_a_resume_cuts_the_retaken_steps(tmp_path):
    log = ScheduleLog(tmp_path, "d1g3st", 2)
    for step, versions in ((0, [0, 0]), (1, [0, 1]), (2, [1, 2]), (3, [2, 3])):
        log.record(step, [_episode(10 + step, versions), _episode(20 + step, versions[:1])])
    lines = (tmp_path / SCHEDULE_FILE).read_text().splitlines()
    assert json.loads(lines[0]) == {"schedule": 1, "config": "d1g3st", "max_staleness": 2}
    assert json.loads(lines[2]) == {"step": 1, "versions": {"11": [0, 1], "21": [0]}}
    recorded = read_schedule(tmp_path)
    assert (recorded.digest, recorded.max_staleness, sorted(recorded.steps)) == ("d1g3st", 2, [0, 1, 2, 3])
    assert recorded.steps[3] == {13: [2, 3], 23: [2]} and recorded.path == str(tmp_path / SCHEDULE_FILE)

    ScheduleLog(tmp_path, "d1g3st", 2, resume_at=2)  # the resumed run takes steps 2 and 3 again
    assert sorted(read_schedule(tmp_path).steps) == [0, 1]
    assert sorted(read_schedule(tmp_path).steps[1]) == [11, 21]
    with (tmp_path / SCHEDULE_FILE).open("a") as f:  # a kill mid-write leaves a cut last line
        f.write('{"step": 2, "versions": {"12"')
    ScheduleLog(tmp_path, "d1g3st", 2, resume_at=2)  # the resume drops it
    assert sorted(read_schedule(tmp_path).steps) == [0, 1]
    ScheduleLog(tmp_path, "d1g3st", 2)  # a fresh run: the header alone
    assert read_schedule(tmp_path).steps == {}


# --- diverged ---------------------------------------------------------------------------------


def test_diverged_names_the_first_trajectory_whose_turn_versions_differ():
    recorded = {1: [0, 0, 1], 2: [1, 1]}
    assert diverged(recorded, {1: [0, 0, 1], 2: [1, 1]}) is None
    assert diverged(recorded, {1: [0, 0, 1], 2: [1, 2]}) == "trajectory 2: recorded versions [1, 1], replayed [1, 2]"
    assert diverged(recorded, {1: [0, 1, 1], 2: [0, 0]}).startswith("trajectory 1: ")
    # an episode that ended earlier or ran longer than the record is not a divergence
    assert diverged(recorded, {1: [0, 0], 2: [1, 1, 2, 2]}) is None
    assert diverged(recorded, {1: [0, 0, 1]}) is None


# --- VersionGate --------------------------------------------------------------------------------


def _gate(steps: dict, version: int = 0, deadline_s: float = 10.0) -> VersionGate:
    return VersionGate(RecordedSchedule("/runs/a/rollout_schedule.jsonl", "d", 1, steps), version, deadline_s)


def test_a_turn_waits_for_its_recorded_version_and_goes_after_the_push():
    gate = _gate({0: {5: [0, 1]}})
    gate.before_turn(0, 5, 0)  # version 0 is there
    gate.before_turn(0, 5, 2)  # a turn the record does not list runs free
    gate.before_turn(1, 5, 0)  # as does a step it does not list
    t, out = _start(gate.before_turn, 0, 5, 1)
    assert _held(t), "turn 1 was sampled before the generator held its recorded version 1"
    gate.pushed(1)
    assert _went(t, out)


def test_a_push_waits_for_the_older_turns_of_started_rollouts():
    gate = _gate({0: {5: [0, 1]}, 1: {6: [1]}})
    gate.before_push(1)  # nothing started: nothing owed
    gate.started(0)
    t, out = _start(gate.before_push, 1)
    assert _held(t), "weights 1 were pushed before turn 0 of trajectory 5 sampled with weights 0"
    gate.after_turn(0, 5, 0)
    assert _went(t, out)
    gate.pushed(1)
    gate.started(1)
    t, out = _start(gate.before_push, 2)  # turn 1 of trajectory 5 and turn 0 of 6 are owed to weights 1
    assert _held(t)
    gate.after_turn(0, 5, 1)
    assert _held(t)
    gate.after_turn(1, 6, 0)
    assert _went(t, out)


def test_a_rollout_that_finished_releases_a_push_held_by_its_turns_that_never_came():
    gate = _gate({0: {5: [0, 0, 0]}})
    gate.started(0)
    gate.after_turn(0, 5, 0)
    t, out = _start(gate.before_push, 1)
    assert _held(t)
    gate.finished(0)  # the episode ended after one turn
    assert _went(t, out)


def test_a_wait_past_the_deadline_is_a_schedule_error_naming_the_turn():
    gate = _gate({0: {5: [0, 1]}}, deadline_s=0.2)
    with pytest.raises(ScheduleError) as info:
        gate.before_turn(0, 5, 1)
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith("replaying /runs/a/rollout_schedule.jsonl: "), msg
    assert "turn 1 of trajectory 5 (rollout of step 0) for weights 1 waited 0.2 s" in msg
    assert "the replay diverged from the record" in msg
    gate.started(0)
    with pytest.raises(ScheduleError, match=r"the push of weights 1 waited 0\.2 s"):
        gate.before_push(1)


def test_the_gated_policy_counts_turns_per_conversation():
    gate = _gate({0: {7: [0, 1]}})
    gate.started(0)
    asked: list[int] = []
    policy = GatedPolicy(ScriptedPolicy(lambda c: asked.append(c.key) or f"key {c.key}"), gate, 0)
    assert policy.fn is policy.inner.fn  # the inner policy's attributes show through
    sampling = SamplingConfig()
    replies = policy.act([Conversation(key=7), Conversation(key=8)], sampling)  # turn 0 of each: weights 0
    assert [r.text for r in replies] == ["key 7", "key 8"]
    gate.before_push(1)  # turn 0 of trajectory 7 was sampled: weights 1 may go
    t, out = _start(policy.act, [Conversation(key=8), Conversation(key=7)], sampling)  # 7's turn 1: weights 1
    assert _held(t) and asked == [7, 8]
    gate.pushed(1)
    assert _went(t, out) and asked == [7, 8, 8, 7]
    assert policy._turns == {7: 2, 8: 2}


def test_a_rank_of_a_job_owes_only_its_own_trajectories_turns_and_gates_them_by_their_run_wide_ids():
    """Rank 1 of a job plays trajectories 2-3 of the record as its own 0-1 (``offset`` 2): a push
    waits for its turns only (rank 0's trajectory 0 is not sampled here), and its trajectory 1
    (the record's 3) waits for the version recorded for 3."""
    gate = _gate({0: {0: [0, 0], 2: [0], 3: [0, 1]}})
    gate.started(0, range(2, 4))
    assert sorted(gate._pending) == [(0, 2, 0), (0, 3, 0), (0, 3, 1)]
    policy = GatedPolicy(ScriptedPolicy(lambda c: f"key {c.key}"), gate, 0, offset=2)
    sampling = SamplingConfig()
    policy.act([Conversation(key=0), Conversation(key=1)], sampling)  # the record's 2 and 3, turn 0: weights 0
    gate.before_push(1)  # no turn of this rank is owed to weights 0 (rank 0's trajectory 0 is not its own)
    t, out = _start(policy.act, [Conversation(key=1)], sampling)  # the record's 3, turn 1: weights 1
    assert _held(t), "trajectory 1 of rank 1 ran on weights 0, which the record gives its trajectory 1 (rank 0's)"
    gate.pushed(1)
    assert _went(t, out)
    assert policy._turns == {2: 1, 3: 2}


# --- streaming: staleness and resumed in-flight rollouts ---------------------------------------


def test_staleness_is_per_sampled_token_and_counts_trajectories_spanning_versions():
    episodes = [
        _episode(0, [3, 4], tokens=[4, 3]),  # 2 and 1 updates behind step 5: spans two versions
        _episode(1, [4], tokens=[5]),
        _episode(2, [None]),  # an in-process turn: no version, not counted
        _episode(3, [5, 5], tokens=[0, 4]),  # a turn without sampled tokens weighs as one token
    ]
    got = staleness(episodes, 5)
    assert got == {"rollout/staleness_min": 0.0,
                   "rollout/staleness_mean": pytest.approx((2 * 4 + 1 * 3 + 1 * 5 + 0 * 1 + 0 * 4) / 17),
                   "rollout/staleness_max": 2.0,
                   "rollout/multi_version_frac": pytest.approx(1 / 3),
                   "rollout/split_replies": 0.0}
    assert staleness([_episode(0, [None])], 5) == {}
    assert turn_versions(episodes) == {0: [3, 4], 1: [4], 2: [-1], 3: [5, 5]}
    # a reply a push split (rollout.interrupt): each token counts with its own version
    split = _episode(4, [4], tokens=[4])
    split.turns[0].token_versions = [4, 4, 5, 5]
    got = staleness([split, _episode(1, [4], tokens=[2])], 5)
    assert got["rollout/split_replies"] == 1.0 and got["rollout/staleness_min"] == 0.0
    assert got["rollout/staleness_mean"] == pytest.approx((1 + 1 + 0 + 0 + 1 + 1) / 6)
    assert got["rollout/multi_version_frac"] == pytest.approx(1 / 2)


def _driver(sampled: list[int], version: int, max_staleness: int = 2, **kw) -> StreamingDriver:
    engine = type("Generator", (), {"weights_version": version})()  # holds the weights of `version` updates
    return StreamingDriver(lambda pol, k, unshard: sampled.append(k) or RolloutResult([_episode(k, [version])]),
                           None, engine=engine, model=None, max_staleness=max_staleness, steps=6, **kw)


def test_a_streaming_driver_refuses_in_flight_records_out_of_order():
    with pytest.raises(ValueError, match="max_staleness must be >= 1, got 0"):
        _driver([], 3, max_staleness=0)
    sampled: list[int] = []
    driver = _driver(sampled, 3)
    try:
        for bad in ([InFlight(3, 2, RolloutResult([])), InFlight(5, 2, RolloutResult([]))],
                    [InFlight(4, 2, RolloutResult([]))], [{"step": 3}]):
            with pytest.raises(ValueError, match="in-flight rollouts do not follow step 3 in order"):
                driver.resume_in_flight(bad, 3)
        assert sampled == []
    finally:
        driver.close()


def test_the_refusal_of_an_out_of_order_record_names_the_step_it_expected():
    driver = _driver([], 3)
    try:
        with pytest.raises(ValueError) as info:
            driver.resume_in_flight([InFlight(3, 2, RolloutResult([])), InFlight(5, 2, RolloutResult([]))], 3)
        assert "record 1 is not the rollout of step 4" in str(info.value), str(info.value)
    finally:
        driver.close()


def test_the_resumed_in_flight_rollouts_are_the_batches_taken_without_sampling_them_again():
    sampled: list[int] = []
    driver = _driver(sampled, 3)
    saved = [InFlight(3, 2, RolloutResult([_episode(30, [2, 3]), _episode(31, [3])], {"rollout/x": 1.0})),
             InFlight(4, 3, RolloutResult([_episode(40, [3])]))]
    try:
        driver.resume_in_flight(saved, 3)
        got = driver.get(3)
        assert got is saved[0].episodes
        assert got.metrics["rollout/staleness_max"] == 1.0 and got.metrics["rollout/weights_lag"] == 1.0
        assert got.metrics["rollout/multi_version_frac"] == 0.5
        driver.engine.weights_version = 4  # as update 4's push leaves the engine (no push is made)
        assert driver.get(4) is saved[1].episodes
    finally:
        driver.close()
    assert sorted(sampled) == [5]  # only the step no record covered (steps=6: none after 5)


def test_a_batch_older_than_max_staleness_is_an_error_not_trained():
    driver = _driver([], 3)
    try:
        driver.resume_in_flight([InFlight(3, 0, RolloutResult([_episode(30, [0, 3])]))], 3)
        with pytest.raises(RuntimeError, match=r"weights 0, 3 updates old, over rollout.max_staleness=2"):
            driver.get(3)
    finally:
        driver.close()


def test_a_replayed_batch_that_diverged_from_the_record_is_refused():
    replay = RecordedSchedule("/runs/a/rollout_schedule.jsonl", "d", 2, {3: {30: [2, 3]}})
    driver = _driver([], 3, replay=replay, first_step=3, deadline_s=5.0)
    try:
        driver.resume_in_flight([InFlight(3, 2, RolloutResult([_episode(30, [3, 3])]))], 3)
        with pytest.raises(ScheduleError, match=r"step 3's batch diverged from the record \(trajectory 30: recorded "
                                                r"versions \[2, 3\], replayed \[3, 3\]\)"):
            driver.get(3)
    finally:
        driver.close()


def test_half_finished_rollouts_need_the_journal_and_completion_groups_need_completion_order():
    """A checkpoint's half-finished rollouts (``InFlight.replies``) resume only where the replies can
    be served again (an HFPolicy generator); a completion-order stream's groups
    (``InFlight.order``) only in completion order."""
    driver = _driver([], 3)
    try:
        assert driver.journal is None  # no HFPolicy here
        with pytest.raises(ValueError, match=r"holds half-finished rollouts \(step 3\), which only a run whose policy generates through an HFPolicy"):
            driver.resume_in_flight([InFlight(3, 2, RolloutResult([]), replies={0: []})], 3)
        with pytest.raises(ValueError, match="holds the groups of a completion-order stream"):
            driver.resume_in_flight([InFlight(3, 2, RolloutResult([]), order={"units": [], "started": 4})], 3)
    finally:
        driver.close()
