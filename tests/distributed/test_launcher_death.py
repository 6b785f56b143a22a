"""The ranks of ``vagent train --nproc 2`` end with their launcher, however it ends: after a real
SIGKILL of the launcher (torchrun's agent, which then cannot stop them) no rank process is left a
few seconds later, and the run directory's lock is free for ``--resume``."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import psutil
import pytest

from tests.distributed.conftest import SMALL, train_cmd


def _gone(p: psutil.Process) -> bool:
    try:
        return p.status() == psutil.STATUS_ZOMBIE  # ended; its new parent has not reaped it yet
    except psutil.NoSuchProcess:
        return True


def _is_rank(p: psutil.Process) -> bool:
    try:
        return "RANK" in p.environ()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def _lock_free(run) -> bool:
    from vagent.runs.lock import RunDirLocked, check_unlocked

    try:
        check_unlocked(run)
        return True
    except RunDirLocked:
        return False


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_ranks_end_when_the_launcher_is_killed(tmp_path, tiny_vlm_dir):
    from vagent.runs.lock import LOCK_NAME, check_unlocked

    out = tmp_path / "runs"
    # many steps: without their launcher the ranks would go on for minutes
    cmd = train_cmd(2, *SMALL, "steps=500", "log.checkpoint_every=0", "rollout.temperature=1.0", f"out_dir={out}", f"model.path={tiny_vlm_dir}",
                    "model.cache_dir=UNUSED")
    job = subprocess.Popen(cmd, cwd=tmp_path, start_new_session=True, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True,
                           env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1"))
    ranks: list[psutil.Process] = []
    try:
        deadline = time.time() + 240
        while not [p for p in out.glob(f"*/{LOCK_NAME}") if p.read_text().strip()]:  # rank 0 made the run dir
            assert job.poll() is None, "the job ended early:\n" + job.stdout.read()[-4000:]
            assert time.time() < deadline, "no run directory after 240 s"
            time.sleep(0.1)
        ranks = [c for c in psutil.Process(job.pid).children(recursive=True) if _is_rank(c)]
        assert len(ranks) == 2, [c.cmdline() for c in ranks]
        job.send_signal(signal.SIGKILL)
        job.wait(timeout=30)
        (run,) = list(out.iterdir())
        deadline = time.time() + 10  # a zombie's threads may still be ending (its files open) for a moment
        while not (all(_gone(r) for r in ranks) and _lock_free(run)) and time.time() < deadline:
            time.sleep(0.1)
        left = [r.pid for r in ranks if not _gone(r)]
        assert not left, f"ranks {left} still run 10 s after their launcher was SIGKILLed"
        check_unlocked(run)  # rank 0's lock went with it: `--resume` may start
    finally:
        for p in [*ranks, psutil.Process(job.pid) if job.poll() is None else None]:
            if p is not None and not _gone(p):
                p.kill()
