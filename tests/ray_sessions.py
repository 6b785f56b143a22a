"""Which processes of a local Ray cluster are still running: Ray names a cluster's session folder
after the driver that started it (``session_<time>_<driver pid>``); its daemons name the folder in
their command lines, its workers (retitled ``ray::<task>``) write their stdout to a log in it."""

from __future__ import annotations

import os
import re
import time

import psutil


def session_processes(driver_pid: int) -> list[str]:
    """Command lines (shortened) of the live processes of the Ray session ``driver_pid`` started."""
    mark = re.compile(rf"session_[0-9_-]+_{driver_pid}\b")
    alive = []
    for p in psutil.process_iter(["cmdline", "status"]):
        line = " ".join(p.info["cmdline"] or [])
        try:
            line += " " + os.readlink(f"/proc/{p.pid}/fd/1")
        except OSError:
            pass
        if mark.search(line) and p.info["status"] != psutil.STATUS_ZOMBIE:
            alive.append(line[:200])
    return alive


def outlives(driver_pid: int, seconds: float) -> list[str]:
    """``session_processes(driver_pid)`` once none is left, or as they are after ``seconds``."""
    deadline = time.time() + seconds
    while (alive := session_processes(driver_pid)) and time.time() < deadline:
        time.sleep(0.1)
    return alive
