"""One writer per run directory (vagent.runs.lock), with real processes: a second ``vagent train
--resume`` (or ``--nproc 2 --resume``) on a directory whose lock a live process holds is refused
with that process's PID; once it is SIGKILLed its lock is free and the next resume takes it over,
saying whose it was."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vagent.runs.lock import LOCK_NAME, RunDirLocked, check_unlocked, lock_run_dir


def test_lock_refuses_a_second_holder_and_release_empties_it(tmp_path):
    said = []
    with lock_run_dir(tmp_path, say=said.append):
        holder = json.loads((tmp_path / LOCK_NAME).read_text())
        assert holder["pid"] == os.getpid()
        with pytest.raises(RunDirLocked, match=f"PID {os.getpid()} on host"):
            lock_run_dir(tmp_path)  # a second open file: flock refuses it even in one process
        with pytest.raises(RunDirLocked, match=f"kill {os.getpid()}"):
            check_unlocked(tmp_path)
    assert (tmp_path / LOCK_NAME).read_text() == "" and said == []  # released: nothing to take over
    check_unlocked(tmp_path)
    lock_run_dir(tmp_path, say=said.append).release()
    assert said == []


def _train(*args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "vagent", "train", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"), **kw)


#: holds the lock of the run directory argv[1] until killed
_HOLD = ("import sys, time\nfrom vagent.runs.lock import lock_run_dir\nlock = lock_run_dir(sys.argv[1])\n"
         "print('held', flush=True)\ntime.sleep(3600)")


def _holder_pid(path: Path, job: subprocess.Popen, timeout_s: float = 120.0) -> int:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        text = path.read_text() if path.is_file() else ""
        if text.strip():
            return json.loads(text)["pid"]
        assert job.poll() is None, "the first resume ended before it held the lock:\n" + job.stdout.read()
        time.sleep(0.05)
    raise AssertionError(f"no holder in {path} after {timeout_s:.0f} s")


@pytest.mark.timeout(300)
def test_second_resume_is_refused_and_a_dead_holders_lock_is_taken_over(tmp_path):
    from vagent.runconfig import config_to_yaml, load_config

    run = tmp_path / "run"
    run.mkdir()
    # the model does not exist: a resume that gets the lock fails at the model, after taking it
    cfg = load_config(None, ["steps=1", "sft.steps=0", f"model.path={tmp_path / 'no-model'}", "log.tensorboard=false"])
    (run / "config.yaml").write_text(config_to_yaml(cfg))
    # the live job: a process holding the run directory's lock as `vagent train` does (lock_run_dir), for
    # as long as the test needs (a `vagent train --resume` of this config would release it at once)
    first = subprocess.Popen([sys.executable, "-c", _HOLD, str(run)], stdout=subprocess.PIPE, text=True,
                             start_new_session=True)
    try:
        assert first.stdout.readline().strip() == "held"
        pid = _holder_pid(run / LOCK_NAME, first)
        assert pid == first.pid
        second = subprocess.run([sys.executable, "-m", "vagent", "train", "--resume", str(run)], capture_output=True,
                                text=True, timeout=120)
        assert second.returncode == 1, second.stdout + second.stderr
        assert f"being written by a live job: PID {pid} on host" in second.stderr, second.stderr
        assert not (run / "metrics.jsonl").exists() and not (run / "train.log").exists()  # it wrote nothing
        job = subprocess.run([sys.executable, "-m", "vagent", "train", "--nproc", "2", "--resume", str(run)],
                             capture_output=True, text=True, timeout=120)
        assert job.returncode == 1 and f"live job: PID {pid} on host" in job.stderr, job.stdout + job.stderr
        assert "torch.distributed" not in job.stderr  # refused by the launcher, before starting the ranks
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    third = _train("--resume", str(run))
    out, _ = third.communicate(timeout=180)
    assert f"taking over {run / LOCK_NAME}: its holder, PID {pid} on host" in out, out
    assert third.returncode == 1 and "no-model" in out, out  # it went on past the lock, to the model
    assert (run / LOCK_NAME).read_text() == ""  # and released the lock when it failed
