"""A config error under ``vagent train --nproc N`` (issue 44, item 3): found once, before
torchrun starts any rank, with the one-process message; no resume hint without a run directory."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from vagent.distributed.launch import describe_failure, new_run_dirs, resume_hosts

VLLM_RANKS = ("rollout.engine vllm in a job of several ranks runs as Ray actor replicas that every rank shares "
              "(rank 0 pushes the gathered weights): set rollout.replicas N >= 1, or run one process (vLLM in the "
              "training process).")


def _train(*args: str, cwd, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "vagent", "train", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, env=env, start_new_session=True)


def test_a_rollout_setting_no_job_can_run_is_one_line_before_torchrun(tmp_path):
    t0 = time.monotonic()
    out = _train("--nproc", "2", "rollout.engine=vllm", f"out_dir={tmp_path / 'runs'}", cwd=tmp_path)
    took = time.monotonic() - t0
    assert out.returncode == 1
    # one line, no rank tag, no torchrun W/E lines, no resume hint; no rank was started
    assert out.stderr.strip().splitlines() == [f"error: {VLLM_RANKS}"], out.stderr
    assert "torch/distributed" not in out.stderr and "--resume" not in out.stderr
    assert not (tmp_path / "runs").exists()
    assert took < 60, took


def test_an_out_dir_that_is_a_file_is_refused_before_torchrun_as_in_one_process(tmp_path):
    blocker = tmp_path / "f"
    blocker.write_text("")
    one = _train(f"out_dir={blocker}", cwd=tmp_path)
    job = _train("--nproc", "2", f"out_dir={blocker}", cwd=tmp_path)
    assert one.returncode == job.returncode == 1
    assert job.stderr.strip().splitlines() == one.stderr.strip().splitlines()
    assert len(job.stderr.strip().splitlines()) == 1 and "is a file, not a folder" in job.stderr


def test_the_failure_line_resumes_only_a_run_that_exists(tmp_path):
    ends = {0: (1, 100.0), 1: (-signal.SIGTERM, 100.0)}
    assert describe_failure(ends, None, nproc=2).endswith(
        "(rank 1 was killed by SIGTERM). No run directory was written, so there is nothing to resume.")
    assert "--resume" not in describe_failure(ends, None, nproc=2)
    assert describe_failure(ends, "runs/x-1", nproc=2).endswith(
        "`vagent train --nproc 2 --resume runs/x-1` continues the run.")
    # a job of several hosts resumes with the same host arguments on every host, not as one host
    hosts = resume_hosts(2, 1, "10.0.0.1:29400")
    assert hosts == "--nnodes 2 --node-rank R --rdzv-endpoint 10.0.0.1:29400"
    assert describe_failure(ends, "runs/x-1", nproc=1, hosts=hosts).endswith(
        "`vagent train --nproc 1 --nnodes 2 --node-rank R --rdzv-endpoint 10.0.0.1:29400 --resume runs/x-1` on every "
        "host (each with its own --node-rank) continues the run.")
    assert resume_hosts(2, None, "h0:29400") == "--nnodes 2 --rdzv-endpoint h0:29400" and resume_hosts(1, None, None) == ""
    # the run directory a job made is found: new since the start, named after the run
    out = tmp_path / "runs"
    (out / "demo-20240101-000000").mkdir(parents=True)
    before = set(out.glob("demo-*"))
    start = time.time()
    (out / "other-20250101-000000").mkdir()
    (out / "demo-20250101-000000").mkdir()
    assert new_run_dirs(out, "demo", start, before) == [out / "demo-20250101-000000"]
    assert new_run_dirs(tmp_path / "missing", "demo", start, set()) == []


def test_a_rank_that_fails_before_the_run_directory_gets_no_resume_hint(tmp_path):
    """A real job whose ranks fail at the model build (a model directory that does not exist,
    which the one-process checks leave to the model loader): no run directory, no resume command."""
    out = _train("--nproc", "2", "model.path=" + str(tmp_path / "no-model"), f"out_dir={tmp_path / 'runs'}",
                 "threads=1", cwd=tmp_path, timeout=240)
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("error: the torchrun job failed: rank "), out.stderr[-3000:]
    assert last.endswith("No run directory was written, so there is nothing to resume."), last
