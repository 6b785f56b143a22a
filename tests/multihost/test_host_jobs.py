"""Whole jobs across the namespace hosts (tests/multihost/cluster.py): docs/distributed.md's SLURM
script, and a job that loses a host and resumes on the same hosts.

- the SLURM script of docs/distributed.md, as written (extracted from the markdown as
  tests/distributed/test_launch.py does), with stand-ins for ``srun`` (task i started on host i,
  ``ip netns exec``, ``SLURM_NODEID`` i) and ``scontrol`` (naming host0's address): two tiny PPO
  steps on 2 node ranks that meet over the veth link; global rank 0 runs on node rank 0, and host1's
  ``eth0`` carries the job's traffic;
- that same 2-step job started with ``vagent train --nproc 1 --nnodes 2 --node-rank R
  --rdzv-endpoint <host0>:PORT`` on host0 and host1, host1's processes SIGKILLed once checkpoint
  ``step_000001`` is written (host0's job then fails), and ``--resume RUN`` with the same host
  arguments on both hosts: the resumed run continues from step 1 and ends with the SLURM job's
  weights (bit for bit: same ranks, same hosts) and its metrics. Host0's job, failed, names the
  host whose rank closed the connection and the checkpoint to resume from, at once (host1's kernel
  closes its connections as its processes die).

The SLURM job runs once per module and is the uninterrupted run the resume is compared with (one
2-host job less: the file takes 45-55 s on the 2-core machine).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import yaml

from tests.distributed.conftest import SMALL, checkpoint_weights, max_rel_diff, metrics, train_cmd
from tests.distributed.test_launch import slurm_folder
from tests.multihost import cluster as C
from tests.multihost.test_hosts import _env, _on, _start_job, _stop, _tx_bytes, _wait_all

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "frozenlake_ppo.yaml"
#: the job both tests run: two tiny PPO steps (a checkpoint after each), rollouts sampled at
#: temperature 1 (seeds derived from the run's seed, the turn and the rank: a resumed step 2 draws
#: what the uninterrupted one drew)
JOB = [*SMALL, "steps=2", "rollout.temperature=1.0"]
#: the rendezvous ports on host0: the SLURM job's, the killed job's, the resume's
SLURM_PORT, KILLED_PORT, RESUME_PORT = 29410, 29420, 29421

#: srun on the namespace cluster: one task per node of a 2-node allocation, task i started on host i
#: (its network namespace, $NETNS_i) with SLURM_NODEID i; each task's output in task<i>.log
SRUN = """#!/bin/bash
pids=()
for id in 0 1; do
  netns=NETNS_$id
  SLURM_NODEID=$id SLURM_PROCID=$id ip netns exec "${!netns}" "$@" > "$SRUN_LOGS/task$id.log" 2>&1 & pids+=($!)
done
rc=0; for p in "${pids[@]}"; do wait "$p" || rc=1; done; exit $rc
"""
#: scontrol: the allocation's first node is host0
SCONTROL = """#!/bin/sh
[ "$1 $2" = "show hostnames" ] && echo "$HEAD_ADDRESS"
"""


@dataclass(frozen=True)
class SlurmJob:
    """The SLURM script's job on host0 and host1, as it ended."""

    returncode: int
    #: the batch script's own output, then each task's (task0.log on host0, task1.log on host1)
    output: str
    tasks: tuple[str, str]
    #: the run directory (None when the job wrote none)
    run: Path | None
    #: bytes host1 sent over its eth0 during the job
    host1_sent: int
    wall_s: float
    #: ``{namespace: pids}`` still running when the batch script had ended (then killed)
    left: dict[str, list[int]]


def _comparable(records: list[dict]) -> list[dict]:
    """Metric records without wall-clock fields (time, perf/*, *_time_s)."""
    return [{k: v for k, v in r.items() if k != "time" and not k.startswith("perf/") and not k.endswith("time_s")}
            for r in records]


def _config(run: Path) -> dict:
    """The run's resolved config.yaml without the fields where the two jobs differ (their folders)."""
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    cfg.pop("out_dir")
    cfg["model"].pop("cache_dir")
    return cfg


@pytest.fixture(scope="module")
def slurm_job(netns_cluster: C.Cluster, tmp_path_factory, tiny_vlm_dir) -> SlurmJob:
    """docs/distributed.md's SLURM script run as written, its two tasks on host0 and host1."""
    cl, tmp = netns_cluster, tmp_path_factory.mktemp("slurm")
    script, bin_dir, venv = slurm_folder(tmp, SRUN, SCONTROL)
    shared = tmp / "shared"
    env = _env(PATH=f"{bin_dir}:{os.environ['PATH']}", SRUN_LOGS=str(tmp), NETNS_0=cl.host(0).netns,
               NETNS_1=cl.host(1).netns, HEAD_ADDRESS=cl.host(0).address, SLURM_NNODES="2",
               SLURM_JOB_NODELIST="host0,host1", VAGENT_VENV=str(venv), SHARED=str(shared), NPROC="1",
               RDZV_PORT=str(SLURM_PORT), CONFIG=str(CONFIG), GLOO_SOCKET_IFNAME=C.INTERFACE)
    sent_before = _tx_bytes(cl, 1)
    t0 = time.monotonic()
    job = subprocess.Popen(["bash", str(script), *JOB, f"model.path={tiny_vlm_dir}"], cwd=tmp, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = job.communicate(timeout=400)
    except subprocess.TimeoutExpired:
        out = "the SLURM job did not end in 400 s (killed)"
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait(timeout=30)
        left = C.leftover(cl)  # after a job that ended, none: what torchrun started ended with it
        for ns in left:  # torchrun's workers have sessions of their own: killpg misses them
            C.kill_all(ns)
    wall = time.monotonic() - t0
    tasks = tuple((tmp / f"task{i}.log").read_text() if (tmp / f"task{i}.log").is_file() else "" for i in (0, 1))
    runs = list((shared / "runs").iterdir()) if (shared / "runs").is_dir() else []
    return SlurmJob(job.returncode, out, (tasks[0], tasks[1]), runs[0] if len(runs) == 1 else None,
                    _tx_bytes(cl, 1) - sent_before, wall, left)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_slurm_script_runs_one_task_per_host_with_rank_0_on_node_rank_0(cluster, slurm_job):
    """docs/distributed.md's SLURM script: srun starts task i on host i, scontrol names host0, the node
    ranks meet at host0's address over the veth link (static rendezvous)."""
    job = slurm_job
    print(f"SLURM script on 2 hosts: the job (2 steps) took {job.wall_s:.1f} s; host1 sent "
          f"{job.host1_sent / 1e6:.1f} MB over its eth0")
    assert job.returncode == 0, job.output[-3000:] + "\n".join(t[-3000:] for t in job.tasks)
    assert job.left == {}, f"processes outlived the batch script on the hosts (now killed): {job.left}"
    assert "run directory:" in job.tasks[0] and "run directory:" not in job.tasks[1], job.tasks  # rank 0 on host0
    assert "ranks: 2 (2 nodes x 1, torchrun)" in job.tasks[0] and "on 2 ranks" in job.tasks[0] \
        and "wall time:" in job.tasks[0], job.tasks[0][-3000:]
    for task in job.tasks:
        for text in ("recvVector", "node_rank is only used", "Traceback", "TCPStore"):
            assert text not in task, (text, task[-3000:])
    assert job.host1_sent > 1_000_000, (f"host1 sent only {job.host1_sent} bytes over its interface: the node ranks "
                                        "did not talk over the link")
    assert job.run is not None, "the job wrote no run directory (or several) under $SHARED/runs"
    environment = json.loads((job.run / "environment.json").read_text())
    assert (environment["ranks"], environment["nodes"]) == (2, 2)
    assert json.loads((job.run / "summary.json").read_text())["ranks"] == 2
    assert sorted(p.name for p in (job.run / "checkpoints").iterdir() if p.name.startswith("step_")) == [
        "step_000001", "step_000002"]
    assert (job.run / "checkpoints" / "step_000001" / "dcp").is_dir()  # the ranks' shards


def _resume_cmd(cl: C.Cluster, rank: int, run: Path) -> list[str]:
    """The resume the failed job's error line prints, on host ``rank``: the job's host arguments and ``--resume``."""
    return train_cmd(1, "--nnodes", "2", "--node-rank", str(rank), "--rdzv-endpoint",
                     f"{cl.host(0).address}:{RESUME_PORT}", "--resume", str(run))


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_job_that_lost_host1_resumes_on_the_same_hosts_as_if_uninterrupted(cluster, tmp_path, tiny_vlm_dir,
                                                                             slurm_job):
    """Host1's processes SIGKILLed after checkpoint step_000001; `vagent train --nproc 1 --nnodes 2 --node-rank R
    --rdzv-endpoint <host0>:PORT --resume RUN` on host0 and host1 ends with the uninterrupted (SLURM) job's
    step-2 weights and metrics."""
    assert slurm_job.returncode == 0 and slurm_job.run is not None, "the uninterrupted job (the SLURM test's) failed"
    logs = [tmp_path / "node0.log", tmp_path / "node1.log"]
    t0 = time.monotonic()
    nodes = _start_job(cluster, tmp_path, tiny_vlm_dir, *JOB[len(SMALL):], "--config", str(CONFIG), port=KILLED_PORT)
    try:
        deadline = time.monotonic() + 400
        while not list((tmp_path / "runs").glob("*/checkpoints/step_000001/state.pt")):
            assert nodes[0].poll() is None and nodes[1].poll() is None, "\n".join(log.read_text()[-3000:]
                                                                                  for log in logs)
            assert time.monotonic() < deadline, "no checkpoint step_000001 after 400 s"
            time.sleep(0.05)
        C.kill_all(cluster.host(1).netns)
        t_kill = time.monotonic()
        code = _wait_all(cluster, nodes[:1], 120, logs[:1])[0]
        heard_s = time.monotonic() - t_kill
    finally:
        _stop(*nodes, cluster=cluster)
    killed_s = time.monotonic() - t0
    text = logs[0].read_text()
    # host1's kernel closes its connections as its processes die, so host0 hears at once, well within
    # its collectives' dist.timeout_s=60 (tests/multihost/test_hosts.py: a cut cable, heard at the timeout)
    print(f"host1's processes killed: host0's job ended {heard_s:.1f} s later")
    assert code == 1 and "--nnodes 2 --node-rank R --rdzv-endpoint" in text, text[-4000:]
    assert "rank 0/2: collective '" in text and "dist.timeout_s=60s" in text, text[-4000:]
    assert "error: the torchrun job failed: rank 0 exited with status 1" in text, text[-4000:]
    assert "(the newest: step_000001" in text, text[-2000:]
    # gloo words a lost peer as "Connection closed by peer [ADDR]" or "Read error [ADDR]:PORT:
    # Connection reset by peer", by timing; vagent's own line names the host either way
    assert f": rank 1 (host {cluster.host(1).address}) closed the connection" in text, text[-4000:]
    assert heard_s < 60, f"host0 stopped {heard_s:.0f} s after host1's processes were killed (dist.timeout_s=60)"
    (run,) = list((tmp_path / "runs").iterdir())
    assert not (run / "checkpoints" / "step_000002").exists(), "the job finished step 2 before host1 was killed"

    t0 = time.monotonic()
    resumed = [tmp_path / "resume0.log", tmp_path / "resume1.log"]
    procs = [_on(cluster, r, _resume_cmd(cluster, r, run), resumed[r], GLOO_SOCKET_IFNAME=cluster.host(r).interface)
             for r in (0, 1)]
    try:
        codes = _wait_all(cluster, procs, 400, resumed)
    finally:
        _stop(*procs, cluster=cluster)
    resume_s = time.monotonic() - t0
    texts = [log.read_text() for log in resumed]
    print(f"killed job {killed_s:.1f} s (to its step-1 checkpoint and host0's end), resume {resume_s:.1f} s")
    assert codes == [0, 0], "\n".join(t[-4000:] for t in texts)
    assert f"resuming from {run / 'checkpoints' / 'step_000001'} (rl step 1)" in texts[0], texts[0][-3000:]
    assert "ranks: 2 (2 nodes x 1, torchrun)" in texts[0] and "run directory:" not in texts[1]

    uninterrupted = slurm_job.run
    assert _config(run) == _config(uninterrupted), "the killed job's config is not the SLURM job's"
    got, want = metrics(run), metrics(uninterrupted)
    assert [r["step"] for r in got] == [r["step"] for r in want], (got, want)
    for k in ("rollout/batch_tokens", "reward/mean"):
        assert [r.get(k) for r in got] == [r.get(k) for r in want], k
    assert _comparable(got) == _comparable(want)
    # step 2's metrics come before its optimizer step: the weights are what show a lost Adam state
    # (its moments zeroed in step_000001 before the resume: 5e-3 relative apart)
    a = checkpoint_weights(run / "checkpoints" / "step_000002")
    b = checkpoint_weights(uninterrupted / "checkpoints" / "step_000002")
    diff = max_rel_diff(b, a)
    print(f"resumed vs uninterrupted: the step-2 weights differ by {diff:.2e} relative")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), (
        f"same ranks on the same hosts: the resumed weights should be bit-exact, they differ by {diff:.2e} relative")
