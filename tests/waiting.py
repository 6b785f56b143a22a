"""Waiting for a file that a running subprocess writes (a run's checkpoint), so a test can kill the
process at that point: shared by the SIGKILL-and-resume tests (recipes, sweep, Ray, overlap)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path


def wait_for_file(proc: subprocess.Popen, root: Path, pattern: str, what: str, timeout_s: float,
                  poll_s: float = 0.05) -> Path:
    """The first path matching ``root.glob(pattern)``, once one exists while ``proc`` still runs.

    Fails (AssertionError) when ``proc`` ends first, with the end of its output where its stdout is
    a text pipe, when it has ended by the time the file is found, or after ``timeout_s`` seconds;
    ``what`` names the file in the message ("its second RL checkpoint")."""
    deadline = time.time() + timeout_s
    while True:
        found = sorted(root.glob(pattern))
        if found:
            assert proc.poll() is None, f"the run ended right after {what}, before it could be killed"
            return found[0]
        if proc.poll() is not None:
            tail = proc.stdout.read()[-4000:] if proc.stdout is not None else ""
            raise AssertionError(f"the run ended before {what}" + (f":\n{tail}" if tail else ""))
        assert time.time() < deadline, f"{what} did not appear within {timeout_s:g} s"
        time.sleep(poll_s)
