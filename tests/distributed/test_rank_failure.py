"""One rank of a 2-process job fails while the other runs on: the job ends (it does not wait forever),
says which rank failed, and keeps its checkpoints, so ``--resume`` finishes the run.

- a rank killed with SIGKILL (the OOM killer's way): torchrun sees the worker die, stops the
  other rank and names the dead one; the resumed run equals the uninterrupted one, its metrics
  record for record and its weights bit for bit (same world size). A whole job SIGKILLed (the
  launcher and every rank) and resumed: the 2-rank jobs of tests/recipes/test_streaming.py.
- a rank that hangs (SIGSTOP): the other rank's collective gives up after ``dist.timeout_s`` with
  an error naming its rank, the collective and the setting; torchrun then stops the hung rank.
- with engine replicas, no process of rank 0's Ray cluster outlives the failed job: the 2-rank case
  of tests/recipes/test_overlap_resume.py kills rank 1 of such a job and resumes it."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
import torch

from tests.distributed.conftest import SFT_PPO, SMALL, checkpoint_weights, metrics, rank_process, run_job, train_cmd


def _comparable(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "time" and not k.startswith("perf/") and not k.endswith("time_s")}
            for r in records]


def _start(tmp_path: Path, tiny_vlm_dir: Path, *extra: str) -> tuple[subprocess.Popen, Path]:
    out = tmp_path / "runs"
    cmd = train_cmd(2, *SMALL, *SFT_PPO, *extra, f"out_dir={out}", f"model.path={tiny_vlm_dir}",
                    "model.cache_dir=UNUSED")
    job = subprocess.Popen(cmd, cwd=tmp_path, start_new_session=True, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True,
                           env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1"))
    return job, out


def _after_first_checkpoint(job: subprocess.Popen, out: Path) -> Path:
    deadline = time.time() + 300
    while not list(out.glob("*/checkpoints/step_000001/state.pt")):
        assert job.poll() is None, "the job ended before its first checkpoint:\n" + job.stdout.read()[-4000:]
        assert time.time() < deadline, "no checkpoint after 300 s"
        time.sleep(0.05)
    (run,) = list(out.iterdir())
    return run


def _finish(job: subprocess.Popen, limit_s: float) -> tuple[int, str, float]:
    """Wait for the job; its exit status, output and seconds waited. Past ``limit_s`` the job is
    killed and the test fails: the failure of one rank must end the job."""
    t0 = time.time()
    try:
        text, _ = job.communicate(timeout=limit_s)
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
        text, _ = job.communicate()
        pytest.fail(f"the job still ran {limit_s:.0f} s after one rank failed:\n{text[-4000:]}")
    return job.returncode, text, time.time() - t0


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_killed_rank_ends_the_job_and_the_run_resumes(sft_ppo_two, tmp_path, tiny_vlm_dir):
    job, out = _start(tmp_path, tiny_vlm_dir)
    try:
        run = _after_first_checkpoint(job, out)
        rank_process(job, 1).send_signal(signal.SIGKILL)
        code, text, waited = _finish(job, limit_s=120)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    print(f"the job ended {waited:.1f} s after rank 1 was killed")
    assert code == 1, text[-4000:]
    assert ("error: the torchrun job failed: rank 1 was killed by SIGKILL (the kernel's out-of-memory killer"
            in text and "then torchrun stopped the others (rank 0 " in text), text[-4000:]
    assert not (run / "summary.json").exists() and not (run / "checkpoints" / "step_000002").exists(), \
        "the job finished step 2 although a rank was dead"

    run_job(train_cmd(2, "--resume", str(run)), tmp_path)
    assert _comparable(metrics(run)) == _comparable(metrics(sft_ppo_two))
    a = checkpoint_weights(run / "checkpoints" / "step_000002")
    b = checkpoint_weights(sft_ppo_two / "checkpoints" / "step_000002")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), \
        "same world size: the resumed weights are bit-exact"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_hung_rank_fails_the_other_at_the_collective_timeout(tmp_path, tiny_vlm_dir):
    timeout_s = 15
    job, out = _start(tmp_path, tiny_vlm_dir, f"dist.timeout_s={timeout_s}")
    try:
        run = _after_first_checkpoint(job, out)
        hung = rank_process(job, 1)
        hung.send_signal(signal.SIGSTOP)
        # rank 0 waits dist.timeout_s in its next collective; torchrun then stops rank 1 (SIGTERM,
        # which a stopped process only takes when continued, then SIGKILL after its grace period)
        code, text, waited = _finish(job, limit_s=timeout_s + 150)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    print(f"the job ended {waited:.1f} s after rank 1 stopped")
    assert code == 1, text[-4000:]
    assert "rank 0/2: collective '" in text and f"dist.timeout_s={timeout_s}s" in text, text[-4000:]
    assert "error: the torchrun job failed: rank 0 exited with status 1 (its error is above); then torchrun " \
           "stopped the others (rank 1 was killed by SIGKILL)" in text, text[-4000:]
    assert waited >= timeout_s - 1, "rank 0 gave up before dist.timeout_s"
    try:
        assert hung.status() == psutil.STATUS_ZOMBIE, "the hung rank outlived the job"
    except psutil.NoSuchProcess:
        pass  # reaped: gone
    assert (run / "checkpoints" / "step_000001" / "state.pt").is_file()


def test_the_failure_report_names_the_rank_that_failed_first():
    from vagent.distributed.launch import describe_failure

    # torchrun found rank 1 killed, then stopped rank 0 in the same second (its order says so)
    killed = describe_failure({1: (-signal.SIGKILL, 100.0), 0: (-signal.SIGTERM, 100.0)})
    assert killed.startswith("rank 1 was killed by SIGKILL (the kernel's out-of-memory killer")
    assert "then torchrun stopped the others (rank 0 was killed by SIGTERM)" in killed
    assert killed.endswith("`vagent train --nproc N --resume <run directory>` continues the run.")
    # a rank's exception, then the hung rank killed after torchrun's grace period
    raised = describe_failure({1: (-signal.SIGKILL, 130.0), 0: (1, 100.0)})
    assert raised.startswith("rank 0 exited with status 1 (its error is above); then torchrun stopped the others "
                             "(rank 1 was killed by SIGKILL)")
    # rank 1 terminated from outside; rank 0, a Ray driver, aborted on torchrun's SIGTERM
    assert describe_failure({1: (-15, 5.0), 0: (-6, 5.0)}).startswith(
        "rank 1 was killed by SIGTERM; then torchrun stopped the others (rank 0 was killed by SIGABRT)")
    assert describe_failure({0: (-99, 1.0)}).startswith("rank 0 was killed by signal 99.")


def test_the_failure_report_names_the_newest_checkpoint_the_resume_starts_from(tmp_path):
    from vagent.distributed.launch import describe_failure, newest_checkpoint

    ckpts = tmp_path / "checkpoints"
    for name in ("sft_000004", "step_000001", "step_000002", ".tmp-step_000003"):
        (ckpts / name).mkdir(parents=True)
        (ckpts / name / "state.pt").write_bytes(b"")
    assert newest_checkpoint(tmp_path) == "step_000002" and newest_checkpoint(None) is None
    assert newest_checkpoint(tmp_path / "missing") is None
    said = describe_failure({0: (1, 5.0)}, tmp_path, nproc=2, newest=newest_checkpoint(tmp_path))
    assert said.endswith(f"The checkpoints written so far are kept (the newest: step_000002): `vagent train --nproc 2 "
                         f"--resume {tmp_path}` continues the run."), said


def test_a_failed_collective_names_the_ranks_of_the_host_behind_the_address():
    """gloo's error names the peer's address (``Connection closed by peer [10.0.0.2]:53934``); the
    world knows each rank's address, so the message names the ranks on that host."""
    from vagent.distributed.collectives import _lost_ranks
    from vagent.distributed.world import World

    w = World(rank=0, size=4, timeout_s=15, addresses=("10.0.0.1", "10.0.0.1", "10.0.0.2", "10.0.0.2"))
    text = "[../third_party/gloo/gloo/transport/tcp/pair.cc:538] Connection closed by peer [10.0.0.2]:53934"
    assert _lost_ranks(w, text) == (": ranks 2, 3 (host 10.0.0.2) closed the connection or stopped answering "
                                    "(its process or host is gone)")
    assert _lost_ranks(w, "Connection closed by peer [10.0.0.1]:4000") == ""  # this rank's own host names no one
    # a silent host: gloo names no peer; the ranks on other hosts are named as the candidates
    assert _lost_ranks(w, "Timed out waiting 15000ms for recv operation to complete") == (
        ": no answer within dist.timeout_s=15s; a host that went silent (its network cut, or powered off) is the "
        "usual cause; the ranks on other hosts: ranks 2, 3 (host 10.0.0.2)")
    same_host = World(rank=0, size=2, timeout_s=15, addresses=("127.0.0.1", "127.0.0.1"))
    assert _lost_ranks(same_host, "Timed out waiting 15000ms for recv operation to complete") == ""
    one = World(rank=1, size=2, addresses=("10.9.8.1", "10.9.8.2"))
    assert _lost_ranks(one, "Connection reset by peer [10.9.8.1]:1").startswith(": rank 0 (host 10.9.8.1) closed")


def test_a_rank_that_refuses_to_run_is_not_told_to_rerun_the_same_command(tmp_path, tiny_vlm_dir):
    """A rank of a launched job that refuses (its checkpoints all damaged: nothing a rerun changes)
    exits REFUSED_EXIT, and the launcher's line says to fix the error, not to run the command again;
    the same process outside a job exits 1 as every refusal does."""
    import sys

    from vagent.distributed.launch import describe_failure
    from vagent.exit_codes import LAUNCHER_PID_ENV, REFUSED_EXIT

    said = describe_failure({1: (REFUSED_EXIT, 5.0), 0: (-signal.SIGTERM, 6.0)}, tmp_path, nproc=2, newest="step_1")
    assert said.startswith(f"rank 1 exited with status {REFUSED_EXIT} (it refused to run: its error above names")
    assert "Rerunning the same command refuses again: fix what the error says first" in said
    assert "continues the run" not in said and "--resume" not in said
    run = tmp_path / "run"
    run_job(train_cmd(None, *SMALL, f"out_dir={run}", f"model.path={tiny_vlm_dir}", "model.cache_dir=UNUSED"),
            tmp_path, timeout=300)
    (root,) = [p for p in run.iterdir() if p.is_dir()]
    (root / "summary.json").unlink()  # not finished: the resume goes on to its checkpoints
    for state in root.glob("checkpoints/*/state.pt"):
        state.write_bytes(b"damaged")
    codes = {}
    for in_job in (False, True):
        env = {k: v for k, v in os.environ.items() if k != LAUNCHER_PID_ENV}
        if in_job:
            env[LAUNCHER_PID_ENV] = str(os.getpid())
        out = subprocess.run([sys.executable, "-m", "vagent", "train", "--resume", str(root), "steps=2"], cwd=tmp_path,
                             env=env, capture_output=True, text=True, timeout=300)
        errors = [line for line in out.stderr.splitlines() if line.startswith("error: ")]
        assert errors and "no intact checkpoint" in errors[0], out.stderr[-3000:]
        codes[in_job] = out.returncode
    assert codes == {False: 1, True: REFUSED_EXIT}
