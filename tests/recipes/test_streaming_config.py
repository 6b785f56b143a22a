"""A streaming config that cannot run (``rollout.max_staleness``, ``rollout.replay_schedule``) is
refused at load, before any model work, in one line that says what was expected and how to fix
it; so is a streaming run in a job of several ranks (``check_rollout_setup``)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vagent.config import ConfigError
from vagent.runconfig import RolloutConfig, load_config
from vagent.runconfig.validate import check_streaming
from vagent.rollout.driver import check_rollout_setup
from vagent.rollout.schedule import SCHEDULE_FILE, ScheduleLog, schedule_digest

ROOT = Path(__file__).resolve().parents[2]
STREAM = ["rollout.max_staleness=1", "rollout.replicas=1"]


def _refused(overrides: list[str]) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(None, overrides)
    msg = str(info.value)
    assert "\n" not in msg, msg
    return msg


def _recorded(run: Path, overrides: list[str], max_staleness: int = 1) -> Path:
    """A streaming run directory whose schedule was recorded under the config of ``overrides``."""
    run.mkdir(parents=True, exist_ok=True)
    ScheduleLog(run, schedule_digest(dataclasses.asdict(load_config(None, overrides))), max_staleness)
    return run


def test_a_negative_max_staleness_is_refused():
    msg = _refused(["rollout.max_staleness=-1"])
    assert msg.startswith("rollout.max_staleness must be an integer in [0, 64]") and "got -1" in msg, msg
    assert "0 = off" in msg and "Set rollout.max_staleness=" in msg
    cfg = load_config(None, [])
    cfg.rollout.max_staleness = -1  # past the range check: check_streaming's own
    with pytest.raises(ConfigError, match=r"rollout.max_staleness must be an integer >= 0 .*0 = off.*got -1"):
        check_streaming(cfg)


def test_streaming_without_engine_replicas_is_refused():
    msg = _refused(["rollout.max_staleness=2"])
    assert msg.startswith("rollout.max_staleness 2 streams rollouts on engine replicas"), msg
    assert "set rollout.replicas >= 1" in msg and "or max_staleness 0" in msg


def test_streaming_with_overlap_is_refused():
    msg = _refused([*STREAM, "rollout.overlap=1"])
    assert msg.startswith("rollout.max_staleness 1 replaces rollout.overlap 1"), msg
    assert "set rollout.overlap 0" in msg


def test_a_replay_without_streaming_is_refused(tmp_path):
    run = _recorded(tmp_path / "run", STREAM)
    for extra in ([], ["rollout.replicas=1"]):
        msg = _refused([*extra, f"rollout.replay_schedule={run}"])
        assert msg.startswith(f"rollout.replay_schedule {run} replays a streaming run's schedule"), msg
        assert "set rollout.max_staleness to the recorded run's K, or drop rollout.replay_schedule" in msg


@pytest.mark.parametrize("where", ["missing", "empty-dir"])
def test_a_replay_of_a_missing_schedule_is_refused(tmp_path, where):
    path = tmp_path / "no-such-run" if where == "missing" else tmp_path
    msg = _refused([*STREAM, f"rollout.replay_schedule={path}"])
    assert msg.startswith(f"rollout.replay_schedule {path}: no {SCHEDULE_FILE} there"), msg
    assert "give the run directory of a streaming run" in msg


def test_a_damaged_schedule_is_refused(tmp_path):
    (tmp_path / SCHEDULE_FILE).write_text('{"schedule": 1, "config": "x", "max_staleness": 1}\n{"step": 0, "ver\n')
    msg = _refused([*STREAM, f"rollout.replay_schedule={tmp_path}"])
    assert msg.startswith(f"{tmp_path / SCHEDULE_FILE} is not a rollout schedule vagent wrote"), msg


def test_a_schedule_recorded_under_another_config_is_refused_and_its_own_is_taken(tmp_path):
    other = _recorded(tmp_path / "seed1", [*STREAM, "seed=1"])
    msg = _refused([*STREAM, f"rollout.replay_schedule={other}"])
    assert msg.startswith(f"rollout.replay_schedule {other} was recorded under another config"), msg
    assert "the seed, recipe, envs and rollout section must be those of the recorded run" in msg
    assert "replay it with that run's config.yaml" in msg
    for change in (["rollout.max_turns=3"], ["envs.0.n_train=3"], ["recipe=grpo", "rollout.group_size=2"]):
        other = _recorded(tmp_path / change[-1], [*STREAM, *change])
        assert "recorded under another config" in _refused([*STREAM, f"rollout.replay_schedule={other}"])

    own = _recorded(tmp_path / "own", STREAM)
    cfg = load_config(None, [*STREAM, f"rollout.replay_schedule={own}"])
    assert cfg.rollout.replay_schedule == str(own)
    # the deadlines and the replay path do not decide the episodes: the same schedule replays
    load_config(None, [*STREAM, f"rollout.replay_schedule={own}", "rollout.generate_timeout_s=60",
                       "rollout.push_timeout_s=30"])


def test_a_schedule_of_another_max_staleness_is_refused(tmp_path):
    run = _recorded(tmp_path / "run", STREAM, max_staleness=2)
    msg = _refused([*STREAM, f"rollout.replay_schedule={run}"])
    assert msg.startswith(f"rollout.replay_schedule {run} was recorded with rollout.max_staleness 2, this config "
                          "has 1: set it to 2"), msg


def test_a_job_of_several_ranks_streams_and_replays():
    pytest.importorskip("ray", reason="replicas need Ray")
    check_rollout_setup(RolloutConfig(replicas=2, max_staleness=1), distributed=True)  # streams on N ranks
    check_rollout_setup(RolloutConfig(replicas=2, max_staleness=1, replay_schedule="runs/a"), distributed=True)
    check_rollout_setup(RolloutConfig(replicas=2, overlap=1), distributed=True)
    check_rollout_setup(RolloutConfig(replicas=2, max_staleness=1), distributed=False)


def test_vagent_train_refuses_streaming_without_replicas_in_one_line(tmp_path):
    start = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "vagent", "train", f"out_dir={tmp_path}", "rollout.max_staleness=1"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    took = time.monotonic() - start
    err = out.stderr.strip().splitlines()
    assert out.returncode == 1 and len(err) == 1, out.stderr
    assert err[0].startswith("error: rollout.max_staleness 1 streams rollouts on engine replicas"), err
    assert "set rollout.replicas >= 1" in err[0]
    assert not list(tmp_path.iterdir())  # refused before a run directory was made
    assert took < 60, f"the refusal took {took:.0f} s: it should come before any model work"


def test_interrupt_needs_a_streaming_run_and_no_replay(tmp_path):
    msg = _refused(["rollout.interrupt=true", "rollout.replicas=2"])
    assert msg.startswith("rollout.interrupt stops replies mid-generation when a weight push lands") and \
        "got max_staleness 0, engine hf" in msg, msg
    msg = _refused(["rollout.interrupt=true", "rollout.replicas=2", "rollout.engine=vllm"])
    assert "got max_staleness 0, engine vllm" in msg and "\n" not in msg, msg
    run = _recorded(tmp_path / "run", STREAM, max_staleness=1)
    msg = _refused([*STREAM, "rollout.interrupt=true", f"rollout.replay_schedule={run}"])
    assert msg.startswith("rollout.interrupt splits replies where pushes happen to land"), msg
    for engine in ("hf", "vllm"):  # vLLM replicas stop their replies by request abort (vagent.models.vllm_stepping)
        assert load_config(None, [*STREAM, "rollout.interrupt=true", f"rollout.engine={engine}"]).rollout.interrupt


def test_an_interrupt_the_replicas_do_not_report_stops_the_run_and_one_they_do_is_said():
    """``rollout.interrupt`` is checked against the replicas' own report (``ready()``): a replica
    built without it (the setting lost on the way) would make every push wait for the running
    replies, silently."""
    from vagent.recipes.step import interrupt_report

    assert interrupt_report([True]).startswith("rollout.interrupt: the replica reports that a waiting push stops")
    assert "all 2 replicas report" in interrupt_report([True, True])
    for bad, why in (([True, False], r"replicas \[1\] report it off"), (None, "no report"), ([], "no report")):
        with pytest.raises(RuntimeError, match=rf"rollout.interrupt is on but did not reach the engine replicas \({why}\)"):
            interrupt_report(bad)


def test_completion_order_needs_a_stream_and_too_stale_needs_completion_order():
    msg = _refused(["rollout.batch_order=completion"])
    assert msg.startswith("rollout.batch_order completion forms batches from the groups of every rollout in flight"), msg
    assert "set rollout.max_staleness >= 1" in msg and "got max_staleness 0" in msg
    msg = _refused([*STREAM, "rollout.too_stale=keep"])
    assert msg.startswith("rollout.too_stale keep decides what happens to a group older than max_staleness"), msg
    assert "set rollout.batch_order completion" in msg
    assert load_config(None, [*STREAM, "rollout.batch_order=completion", "rollout.too_stale=keep"]).rollout.too_stale \
        == "keep"
    pytest.importorskip("ray", reason="replicas need Ray")
    check_rollout_setup(RolloutConfig(replicas=2, max_staleness=1, batch_order="completion"), distributed=True)
