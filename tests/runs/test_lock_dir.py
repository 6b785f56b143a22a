"""One writer even without the lock file (issue 47, finding 6): the run directory itself is locked,
so deleting ``run.lock`` while a live process holds the run does not let a second writer in."""

from __future__ import annotations

import subprocess
import sys

import pytest

from vagent.runs.lock import LOCK_NAME, RunDirLocked, check_unlocked, lock_run_dir

_HOLD = ("import sys, time\nfrom vagent.runs.lock import lock_run_dir\nlock = lock_run_dir(sys.argv[1])\n"
         "print('held', flush=True)\ntime.sleep(3600)")


def test_deleting_run_lock_does_not_let_a_second_writer_in(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        (tmp_path / LOCK_NAME).unlink()  # what a user cleaning up might do
        with pytest.raises(RunDirLocked, match="is being written by a live job"):
            lock_run_dir(tmp_path)
        with pytest.raises(RunDirLocked):
            check_unlocked(tmp_path)
    finally:
        holder.kill()
        holder.wait()
    lock_run_dir(tmp_path).release()  # the holder is gone: its directory lock went with it
