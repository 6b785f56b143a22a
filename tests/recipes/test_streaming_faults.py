"""The streaming rollout (``rollout.max_staleness: K``, 2 HF engine replicas) under what a real run
meets: a replica SIGKILLed while rollouts are in flight, a LoRA policy (adapter-only pushes), and
envs served by a ``vagent serve-env`` server on loopback.

- a killed replica loses no trajectory: its requests finish on the other replica
  (``rollout/engine_retries``, the warnings naming the dead replica), every step's batch holds all
  its episodes, the run exits 0 and leaves no process of its Ray cluster; replaying its recorded
  schedule without the kill gives the same episodes (a lost or cut-short turn would differ);
- a LoRA policy streams: its pushes are its ``lora_`` tensors alone (a replica refuses a partial
  push that is not its own adapter, and the canary, run after every push, fails the run when an
  adapter push did not land), staleness stays within K;
- an env entry with ``urls``: the streamed rollouts play on the server, every batch full;
- ``rollout.interrupt``: replies a push lands in stop and continue on the new weights.

The last three check one run (one Ray cluster): a LoRA policy with ``rollout.interrupt`` and
64-token replies, playing on a ``vagent serve-env`` server.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.distributed.conftest import SMALL, metrics, run_job, tiny_vlm_dir, train, train_cmd  # noqa: F401 (fixture)
from tests.ray_sessions import outlives, session_processes
from tests.service.conftest import free_port, stop_process, wait_healthy

pytest.importorskip("ray", reason="streaming needs engine replicas: pip install 'vagent[ray]'")

K = 2
N_TRAIN = 3
#: the streaming run of tests/recipes/test_streaming.py, without checkpoints (a checkpoint drains the
#: stream, so rollouts stay in flight at every step): env steps of ~0.3 s keep them in flight
STREAM = [f"rollout.max_staleness={K}", "rollout.replicas=2", "rollout.schedule=async",
          "ppo.critic_backbone=separate", "update.kl_coef=0", "rollout.temperature=1.0", f"envs.0.n_train={N_TRAIN}",
          "rollout.max_turns=3", "log.checkpoint_every=100",
          "envs.0.latency={dist: lognormal, median_s: 0.3, sigma: 0.3, max_s: 1.0}"]


def _rl(run: Path) -> list[dict]:
    return [r for r in metrics(run) if r.get("phase") == "rl" and "rollout/episodes" in r]


def _assert_full_batches(run: Path, steps: int) -> list[dict]:
    """Every RL step 1..steps logged once, each batch holding all its episodes (n_train x group_size 1),
    sampled within K updates of the trainer; returns the steps' records."""
    rl = _rl(run)
    assert [r["step"] for r in rl] == list(range(1, steps + 1)), [r["step"] for r in rl]
    for r in rl:
        assert r["rollout/episodes"] == N_TRAIN, f"step {r['step']}: {r['rollout/episodes']} episodes of {N_TRAIN}"
        # one row per episode (concat mode), an errored episode counted in rollout/errors and left out
        assert r["rollout/batch_rows"] == N_TRAIN - r["rollout/errors"], r
        assert 0 <= r["rollout/staleness_min"] <= r["rollout/staleness_max"] <= K, r
    return rl


def _schedule_steps(run_dir: Path) -> list[int]:
    path = run_dir / "rollout_schedule.jsonl"
    if not path.is_file():
        return []
    lines = [ln for ln in path.read_text().splitlines()[1:] if ln.strip()]
    try:
        return [json.loads(ln)["step"] for ln in lines]
    except json.JSONDecodeError:  # a line being written
        return []


def _replica_processes(driver: int) -> list[psutil.Process]:
    """The driver's live engine-replica actor processes (Ray retitles them ``ray::EngineReplica``)."""
    from vagent.models.remote import ray_session_processes

    out = []
    for p in ray_session_processes(driver):
        try:
            if "EngineReplica" in " ".join([p.name(), *p.cmdline()]):
                out.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return out


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_replica_killed_mid_stream_loses_no_trajectory(tmp_path: Path, tiny_vlm_dir: Path, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    # killed while step 1 + K's rollout generates (steps 2 and 3 in flight), then one step on the
    # surviving replica alone: its requests and step 4's
    steps = 4
    out = tmp_path / "runs"
    cmd = train_cmd(None, *SMALL, f"out_dir={out}", f"model.path={tiny_vlm_dir}", "model.cache_dir=UNUSED", *STREAM,
                    f"steps={steps}")
    job = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1"), start_new_session=True)
    killed = None
    try:
        # step 1's batch is recorded the moment get(1) has submitted step 1 + K's rollout: kill then,
        # while that rollout's first turns generate (each lasts ~3 env steps of ~0.3 s)
        deadline = time.monotonic() + 400
        while not any(s >= 1 for d in out.glob("*") for s in _schedule_steps(d)):
            assert job.poll() is None, f"the run ended before step 1:\n{job.stdout.read()[-4000:]}"
            assert time.monotonic() < deadline, "step 1's batch was not recorded within 400 s"
            time.sleep(0.02)
        replicas = _replica_processes(job.pid)
        assert len(replicas) == 2, session_processes(job.pid)
        killed = replicas[-1].pid
        os.kill(killed, signal.SIGKILL)
        text, _ = job.communicate(timeout=400)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait(timeout=30)
    assert job.returncode == 0, text[-6000:]
    (run,) = [p for p in out.iterdir() if p.is_dir()]
    rl = _assert_full_batches(run, steps)
    retries = sum(r["rollout/engine_retries"] for r in rl)
    assert retries > 0, f"no request was sent again after replica pid {killed} died: {[r['step'] for r in rl]}"
    log = text + (run / "train.log").read_text() if (run / "train.log").is_file() else text
    assert f"(pid {killed}) died" in log and "sending its" in log, log[-6000:]
    assert "engine replica(s) died during this rollout" in log, log[-6000:]
    assert outlives(job.pid, seconds=30) == [], "processes of the run's Ray cluster outlived it"

    # the same schedule replayed without a kill: the same episodes (per-request seeds make a reply
    # independent of the replica that sampled it), so no trajectory was lost, cut short or errored
    replay = train(tmp_path, tiny_vlm_dir, None, "replay", *STREAM, f"steps={steps}",
                   f"rollout.replay_schedule={run}", timeout=400)
    assert _episodes_of(replay) == _episodes_of(run)


def _episodes_of(run: Path) -> list[dict]:
    """What each RL step's episodes decide: its rollout/ and reward/ metrics (timings and the
    engine's retry count left out)."""
    return [{k: v for k, v in r.items() if k.startswith(("rollout/", "reward/")) and not k.endswith("_s")
             and "per_s" not in k and k != "rollout/engine_retries"} | {"step": r["step"]} for r in _rl(run)]


@pytest.fixture(scope="module")
def frozenlake_server(tmp_path_factory):
    """``vagent serve-env --envs frozenlake --token T`` on a free loopback port."""
    token = "streaming-faults-token-01"
    port = free_port()
    log_path = tmp_path_factory.mktemp("server") / "server.log"
    log = open(log_path, "wb")
    env = {k: v for k, v in os.environ.items() if k != "VAGENT_SERVICE_TOKEN"}
    proc = subprocess.Popen([sys.executable, "-m", "vagent", "serve-env", "--envs", "frozenlake", "--port", str(port),
                             "--token", token], stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(proc, url, 60, log_path.read_text)
        yield url, token, log_path
    finally:
        stop_process(proc, 10)
        log.close()


@pytest.fixture(scope="module")
def lora_run_on_server(tmp_path_factory, tiny_vlm_dir: Path, frozenlake_server):
    """One streaming run of 4 steps (its own Ray cluster) of a LoRA policy whose env entry has
    ``urls`` (its rollouts play on the server), with ``rollout.interrupt`` and replies of 64 tokens;
    the LoRA, server and interrupt tests check it.
    Returns (run directory, the job's output, the server's url, its token)."""
    url, token, _ = frozenlake_server
    tmp = tmp_path_factory.mktemp("lora")
    out = tmp / "lora"
    # a replica refuses (one error, the run fails) a partial push that is not its own adapter; the
    # canary's tolerance (0.01 nats, float32) fails the run when an adapter push did not land
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("RAY_ADDRESS", raising=False)
        mp.setenv("VAGENT_SERVICE_TOKEN", token)
        res = run_job(train_cmd(None, *SMALL, f"out_dir={out}", f"model.path={tiny_vlm_dir}",
                                "model.cache_dir=UNUSED", *STREAM, "steps=4", "model.lora_rank=4", "model.lora_alpha=8",
                                "update.actor_lr=0.01", f"envs.0.urls=[{url}]", "rollout.interrupt=true",
                                "rollout.max_new_tokens=64"), tmp, timeout=350)
    (run,) = [p for p in out.iterdir() if p.is_dir()]
    return run, res.stdout + res.stderr, url, token


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_lora_policy_streams_adapter_only_pushes(lora_run_on_server):
    run, output, _, _ = lora_run_on_server
    rl = _assert_full_batches(run, 4)
    for r in rl:  # the canary's check of the newest weights in the batch, within its tolerance
        assert 0 <= r["sync/canary_max_abs_diff"] <= 0.01, r
        assert r["rollout/weights_version"] + r["rollout/weights_lag"] == r["step"] - 1, r
    # step 4's rollout started after the first adapter push: it sampled with pushed weights, and its
    # canary metrics are that push's check (not version 0's)
    last = rl[-1]
    assert last["rollout/weights_version"] >= 1 and last["sync/canary_s"] != rl[0]["sync/canary_s"], rl
    assert "WeightSyncError" not in output
    # the policy trained its adapter alone (the frozen base equals the model directory's): what
    # pushed_state sends to the replicas, and what they accept as a partial push
    import torch

    saved = torch.load(sorted((run / "checkpoints").glob("step_*"))[-1] / "policy.pt", weights_only=True)
    assert any("lora_" in k for k in saved) and not all("lora_" in k for k in saved), sorted(saved)[:6]


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_streaming_rollouts_play_on_a_remote_env_server(lora_run_on_server):
    run, _, url, token = lora_run_on_server
    _assert_full_batches(run, 4)
    config = (run / "config.yaml").read_text()
    assert url in config and token not in config


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_interrupted_replies_continue_on_the_pushed_weights_in_a_streaming_run(lora_run_on_server):
    """``rollout.interrupt``: replies of 64 tokens are running when the pushes land, so some stop
    and continue on the new weights. Every batch is whole and within K; the replies a push split
    are counted (``rollout/split_replies``) and their tokens carry the versions that sampled them
    in the saved rollouts' token data, which the decoupled loss trains on."""
    run, output, _, _ = lora_run_on_server
    # the setting reached the replicas: each reported it from its own engine when it was ready
    assert "rollout.interrupt: all 2 replicas report that a waiting push stops the replies" in output, output[-3000:]
    steps = 4
    rl = _assert_full_batches(run, steps)
    split = [r["rollout/split_replies"] for r in rl]
    print(f"replies split by a push per step: {split}; staleness max {[r['rollout/staleness_max'] for r in rl]}")
    assert sum(split) >= 1, f"no push landed mid-reply in {steps} steps of 64-token replies: {split}"
    assert all(r["actor/grad_norm"] > 0 and r["actor/updated"] for r in rl), rl
