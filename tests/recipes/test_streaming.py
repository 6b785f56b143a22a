"""The streaming rollout (``rollout.max_staleness: K``) end to end, on 2 HF engine replicas.

One free-running run records its schedule (which weights version sampled each turn); a second run,
replaying that schedule, is SIGKILLed after a checkpoint and resumed, and trains on the same
episodes to the same metrics and weights as the first: its steps before the kill are an
uninterrupted replay, and its resumed process replays on through the checkpoint's rollouts in
flight to the last step, so one run checks both the replay and the resume. A third replays a
forced schedule whose trajectories span weights versions, and a fourth replays the same schedule,
is SIGKILLed after checkpoint 2, which by that schedule holds half-finished trajectories (a turn of
each unfinished rollout waits for weights the checkpoint's update made), and resumes from them to
equal the third. The batches stay within K updates of the trainer and the stream keeps rollouts in
flight. Jobs of 2 ranks, in step and completion order, SIGKILLed and resumed, equal uninterrupted
jobs replaying their schedules within the tolerance two uninterrupted jobs show.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.distributed.conftest import (  # noqa: F401 (fixture)
    checkpoint_weights, killed_after_checkpoint, metrics, run_job, tiny_vlm_dir, train, train_cmd,
)

pytest.importorskip("ray", reason="streaming needs engine replicas: pip install 'vagent[ray]'")

K = 2
STREAM = ["steps=5", f"rollout.max_staleness={K}", "rollout.replicas=2", "rollout.schedule=async",
          "ppo.critic_backbone=separate", "update.kl_coef=0", "rollout.temperature=1.0", "envs.0.n_train=3",
          "rollout.max_turns=3", "log.checkpoint_every=2",
          # env steps of ~0.2 s (lognormal): rollouts last long enough for pushes to land mid-trajectory
          "envs.0.latency={dist: lognormal, median_s: 0.2, sigma: 0.5, max_s: 1.0}"]


#: how far the weights of two jobs of 2 ranks on one schedule may differ: both ranks' requests share
#: the replicas' batches in a timing-dependent mix, which moves the behaviour log-probs by ~1e-7 and
#: the weights after 5 updates by up to ~1.6e-5 (two uninterrupted replays measured 9.5e-6 apart)
JOB_WEIGHTS_ATOL = 5e-5


def _comparable(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "time" and not k.startswith("perf/") and not k.endswith("_s")}
            for r in records]


def _schedule(run: Path) -> list[dict]:
    return [json.loads(ln) for ln in (run / "rollout_schedule.jsonl").read_text().splitlines() if ln.strip()]


#: what the episodes decide (tokens, rewards, versions): equal exactly under one schedule
EXACT = ("phase", "step", "rollout/", "reward/", "mismatch/staleness")


def _weights_gap(a: Path, b: Path) -> float:
    """The largest difference between the last checkpoint's weights of two runs."""
    wa, wb = (checkpoint_weights(sorted((r / "checkpoints").glob("step_*"))[-1]) for r in (a, b))
    assert wa.keys() == wb.keys()
    return max(float((wa[k].float() - wb[k].float()).abs().max()) for k in wa)


def _assert_same(a: Path, b: Path, weights_atol: float = 1e-5) -> None:
    """The same episodes (every rollout/ and reward/ metric exact) and the same training within
    1e-4 relative: a replica's log-probs vary by ~1e-7 with which requests share its batch (the
    behaviour log-probs the decoupled loss weighs by), and the update carries that noise."""
    ra, rb = _comparable(metrics(a)), _comparable(metrics(b))
    assert [(r.get("phase"), r.get("step")) for r in ra] == [(r.get("phase"), r.get("step")) for r in rb]
    for x, y in zip(ra, rb):
        assert x.keys() == y.keys()
        diff = {k: (x[k], y[k]) for k in x if (x[k] != y[k] if k.startswith(EXACT) else
                                               x[k] != pytest.approx(y[k], rel=1e-4, abs=1e-6))}
        assert not diff, f"step {x.get('step')}: {sorted(diff.items())[:8]}"
    gap = _weights_gap(a, b)
    assert gap < weights_atol, f"the weights differ by {gap} (tolerance {weights_atol})"


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_a_streaming_run_records_its_schedule_and_replays_and_resumes_exactly(tmp_path: Path, tiny_vlm_dir: Path,
                                                                               monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    free = train(tmp_path, tiny_vlm_dir, None, "free", *STREAM, timeout=500)
    rl = [r for r in metrics(free) if r.get("phase") == "rl" and "rollout/staleness_max" in r]
    assert [r["step"] for r in rl] == [1, 2, 3, 4, 5]
    for r in rl:  # bounded by construction: a batch is at most K updates behind the trainer
        assert 0 <= r["rollout/staleness_min"] <= r["rollout/staleness_mean"] <= r["rollout/staleness_max"] <= K
        assert r["rollout/weights_lag"] == r["rollout/staleness_max"]
    schedule = _schedule(free)
    assert schedule[0]["max_staleness"] == K and [s["step"] for s in schedule[1:]] == [0, 1, 2, 3, 4]
    lags = [r["rollout/staleness_max"] for r in rl]
    assert max(lags) >= 1, f"the stream never ran ahead of the trainer: staleness {lags}"

    # a schedule where trajectory 0 spans versions (``_forced``), and the decoupled loss trains on it
    mixed = tmp_path / "mixed_schedule.jsonl"
    mixed.write_text("".join(json.dumps(r) + "\n" for r in _forced(schedule, ("0",))))
    # four steps hold the schedule's steps 2 and 3, the spanning ones checked
    spanning = train(tmp_path, tiny_vlm_dir, None, "spanning", *STREAM, f"rollout.replay_schedule={mixed}", "steps=4",
                     timeout=500)
    taken = {r["step"]: r["versions"] for r in _schedule(spanning)[1:]}
    assert taken[2]["0"][:3] == [0, 1, 2] and taken[3]["0"][:2] == [1, 2], taken
    spans = {r["step"]: r for r in metrics(spanning) if "rollout/multi_version_frac" in r}
    assert spans[3]["rollout/multi_version_frac"] > 0 and spans[3]["rollout/staleness_min"] < \
        spans[3]["rollout/staleness_max"] <= K

    # the same schedule killed after checkpoint 2: the rollouts of steps 2 and 3 wait there for weights 2 (their
    # trajectory 0's next turn), so the checkpoint keeps them half-finished, and the resume continues them
    halves = killed_after_checkpoint(tmp_path, tiny_vlm_dir, None, "halves", *STREAM, "steps=4",
                                     f"rollout.replay_schedule={mixed}", timeout=500)
    from vagent.runs.checkpoint import load_object

    kept = load_object(halves / "checkpoints" / "step_000002", "inflight")
    unfinished = {rec.step: rec.replies for rec in kept if rec.replies is not None}
    assert sorted(unfinished) == [2, 3], [(rec.step, rec.replies is not None) for rec in kept]
    for step, replies in unfinished.items():  # trajectory 0 holds its turns before weights 2, none after
        assert [r["weights_version"] for r in replies[0]] == taken[step]["0"][:taken[step]["0"].index(2)], replies[0]
    run_job(train_cmd(None, "--resume", str(halves)), tmp_path, timeout=500)
    assert _schedule(halves)[1:] == _schedule(spanning)[1:]
    _assert_same(spanning, halves)

    # the replay, killed after checkpoint 2 and resumed: equal to the free run (a replay that did not
    # reproduce it, or a resume that did not continue it, differ)
    cut = killed_after_checkpoint(tmp_path, tiny_vlm_dir, None, "cut", *STREAM, f"rollout.replay_schedule={free}",
                                  timeout=500)
    run_job(train_cmd(None, "--resume", str(cut)), tmp_path, timeout=500)
    assert _schedule(cut)[1:] == schedule[1:]
    _assert_same(free, cut)


def _forced(schedule: list[dict], trajs: tuple[str, ...]) -> list[dict]:
    """``schedule`` with turn t of trajectories ``trajs`` of the rollout of step s (started when the
    trainer had made s - K updates) sampled by weights min(s, s - K + t): they span versions."""
    return [schedule[0]] + [{"step": r["step"], "versions": {
        t: ([min(r["step"], max(0, r["step"] - K) + i) for i in range(len(v))] if t in trajs else v)
        for t, v in r["versions"].items()}} for r in schedule[1:]]


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_a_job_of_two_ranks_streams_keeps_half_finished_trajectories_and_resumes_as_its_uninterrupted_replay(
        tmp_path: Path, tiny_vlm_dir: Path, monkeypatch):
    """``--nproc 2`` with K = 2: each rank plays its share of every rollout in flight and the K + 1
    rollouts gather on groups of their own beside the trainer's collectives (a shared group would
    interleave them and hang or mix batches); rank 0 alone records the schedule, one line per step.
    A schedule where one trajectory of each rank (0 on rank 0, 2 on rank 1) spans versions holds the
    rollouts of steps 2 and 3 at checkpoint 2 mid-trajectory on both ranks: the checkpoint keeps both
    ranks' replies so far, keyed by their ids in the run, and the job SIGKILLed there and resumed
    equals an uninterrupted job replaying that schedule, within the tolerance two uninterrupted
    jobs show (JOB_WEIGHTS_ATOL; measured in docs/results.md)."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    job = [*STREAM, "steps=4", "envs.0.n_train=4"]
    free = train(tmp_path, tiny_vlm_dir, 2, "job", *job, timeout=500)
    rl = [r for r in metrics(free) if r.get("phase") == "rl" and "rollout/staleness_max" in r]
    assert [r["step"] for r in rl] == [1, 2, 3, 4], rl
    for r in rl:
        assert r["rollout/episodes"] == 4 and r["rollout/errors"] == 0, r  # both ranks' shares, gathered
        assert 0 <= r["rollout/staleness_min"] <= r["rollout/staleness_max"] <= K, r
    schedule = _schedule(free)
    assert schedule[0]["max_staleness"] == K and [s["step"] for s in schedule[1:]] == [0, 1, 2, 3], schedule

    mixed = tmp_path / "mixed_schedule.jsonl"
    mixed.write_text("".join(json.dumps(r) + "\n" for r in _forced(schedule, ("0", "2"))))
    halves = killed_after_checkpoint(tmp_path, tiny_vlm_dir, 2, "job_halves", *job,
                                     f"rollout.replay_schedule={mixed}", timeout=500)
    from vagent.runs.checkpoint import load_object

    kept = load_object(halves / "checkpoints" / "step_000002", "inflight")
    unfinished = {rec.step: rec.replies for rec in kept if rec.replies is not None}
    assert sorted(unfinished) == [2, 3], [(rec.step, rec.replies is not None) for rec in kept]
    run_job(train_cmd(2, "--resume", str(halves)), tmp_path, timeout=500)
    taken = {r["step"]: r["versions"] for r in _schedule(halves)[1:]}
    assert taken[2]["0"][:3] == taken[2]["2"][:3] == [0, 1, 2] and taken[3]["2"][:2] == [1, 2], taken
    for step, replies in unfinished.items():  # each rank's spanning trajectory: its turns before weights 2
        for t in (0, 2):
            assert [r["weights_version"] for r in replies[t]] == taken[step][str(t)][:taken[step][str(t)].index(2)], \
                (step, t, replies[t])
    replay = train(tmp_path, tiny_vlm_dir, 2, "job_spanning", *job, f"rollout.replay_schedule={mixed}", timeout=500)
    assert _schedule(replay)[1:] == _schedule(halves)[1:]
    print(f"weights gap: resumed job to its uninterrupted replay {_weights_gap(halves, replay):.2e}")
    _assert_same(halves, replay, weights_atol=JOB_WEIGHTS_ATOL)  # the tolerance two uninterrupted jobs show


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_completion_order_batches_record_replay_and_resume_exactly(tmp_path: Path, tiny_vlm_dir: Path, monkeypatch):
    """``rollout.batch_order: completion`` on 2 HF replicas with long-tailed env steps: each batch
    is the first groups to finish among the rollouts in flight (some of a later step's), the schedule
    records them, and a replay of it SIGKILLed after checkpoint 2 and resumed from the groups that
    checkpoint kept (finished, and half-finished: their replies so far) trains on the same batches to
    the same metrics and weights."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    run = [*STREAM, "steps=4", "rollout.batch_order=completion", "envs.0.n_train=4",
           "envs.0.latency={dist: lognormal, median_s: 0.1, sigma: 1.5, max_s: 2.0}"]
    free = train(tmp_path, tiny_vlm_dir, None, "free_completion", *run, timeout=500)
    rl = [r for r in metrics(free) if r.get("phase") == "rl" and "rollout/staleness_max" in r]
    assert [r["step"] for r in rl] == [1, 2, 3, 4]
    for r in rl:
        assert r["rollout/episodes"] == 4 and 0 <= r["rollout/staleness_max"] <= K, r
    schedule = _schedule(free)
    taken = [tuple(u) for rec in schedule[1:] for u in rec["units"]]
    assert len(taken) == 16 and len(set(taken)) == 16, taken  # every group taken once
    slots = [[u // 4 for u, _ in rec["units"]] for rec in schedule[1:]]
    print(f"slots of each batch's groups: {slots}; dropped {[len(rec['dropped']) for rec in schedule[1:]]}")
    cut = killed_after_checkpoint(tmp_path, tiny_vlm_dir, None, "cut_completion", *run,
                                  f"rollout.replay_schedule={free}", timeout=500)
    from vagent.runs.checkpoint import load_object

    (kept,) = load_object(cut / "checkpoints" / "step_000002", "inflight")
    running = {u for u, _, _ in kept.order["running"]}
    # a group the record samples on both sides of weights 2 waits (the replay's gate) at checkpoint 2: kept
    # half-finished, with its replies before weights 2
    spans = {rec["units"][int(t)][0] for rec in schedule[1:] for t, v in rec["versions"].items() if min(v) < 2 <= max(v)}
    print(f"checkpoint 2: finished groups {[u for u, _, _ in kept.order['units']]}, half-finished {sorted(running)}, "
          f"spanning weights 2 by the record {sorted(spans)}")
    assert spans <= running and kept.order["started"] >= 2, (spans, kept.order)
    for u, _, replies in kept.order["running"]:
        assert all(r["weights_version"] < 2 for rs in replies.values() for r in rs), replies
    run_job(train_cmd(None, "--resume", str(cut)), tmp_path, timeout=500)
    assert _schedule(cut)[1:] == schedule[1:]
    _assert_same(free, cut)


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_a_job_of_two_ranks_batches_in_completion_order_and_resumes_as_its_uninterrupted_replay(
        tmp_path: Path, tiny_vlm_dir: Path, monkeypatch):
    """``rollout.batch_order: completion`` with ``--nproc 2``: each rank plays the groups of its
    block of env seeds (groups 0-1 on rank 0, 2-3 on rank 1) in every slot and takes its share of
    each batch from the first of them to finish, so every batch holds rank 0's groups at positions
    0-1 and rank 1's at 2-3, and every group is taken once. SIGKILLed after checkpoint 2 (which holds
    every rank's groups not yet taken, finished or half-finished) and resumed, the job equals an
    uninterrupted job of 2 ranks replaying its schedule."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    run = [*STREAM, "steps=4", "rollout.batch_order=completion", "envs.0.n_train=4",
           "envs.0.latency={dist: lognormal, median_s: 0.1, sigma: 1.5, max_s: 2.0}"]
    cut = killed_after_checkpoint(tmp_path, tiny_vlm_dir, 2, "job_completion", *run, timeout=500)
    from vagent.runs.checkpoint import load_object

    (kept,) = load_object(cut / "checkpoints" / "step_000002", "inflight")
    held = [u for u, _, _ in kept.order["units"]] + [u for u, _, _ in kept.order["running"]]
    print(f"checkpoint 2: finished groups {[u for u, _, _ in kept.order['units']]}, half-finished "
          f"{[u for u, _, _ in kept.order['running']]}")
    # the 8 groups of slots 0-3 not taken by step 2, finished or half-finished, 4 of each rank's block
    assert sorted(u % 4 // 2 for u in held) == [0] * 4 + [1] * 4, kept.order
    run_job(train_cmd(2, "--resume", str(cut)), tmp_path, timeout=500)
    rl = [r for r in metrics(cut) if r.get("phase") == "rl" and "rollout/staleness_max" in r]
    assert sorted({r["step"] for r in rl}) == [1, 2, 3, 4], rl
    for r in rl:
        assert r["rollout/episodes"] == 4 and r["rollout/errors"] == 0 and r["rollout/staleness_max"] <= K, r
    schedule = _schedule(cut)
    blocks = [[u % 4 for u, _ in rec["units"]] for rec in schedule[1:]]
    print(f"each batch's groups (seed index in the step): {blocks}; slots "
          f"{[[u // 4 for u, _ in rec['units']] for rec in schedule[1:]]}")
    assert all(set(b[:2]) <= {0, 1} and set(b[2:]) <= {2, 3} for b in blocks), blocks
    taken = [u for rec in schedule[1:] for u, _ in rec["units"]]
    assert sorted(taken) == list(range(16)), taken  # every group of slots 0-3 taken once
    replay = train(tmp_path, tiny_vlm_dir, 2, "job_completion_replay", *run, f"rollout.replay_schedule={cut}",
                   timeout=500)
    assert _schedule(replay)[1:] == schedule[1:]
    _assert_same(cut, replay, weights_atol=JOB_WEIGHTS_ATOL)
