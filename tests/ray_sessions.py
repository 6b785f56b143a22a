"""Which processes of a local Ray cluster are still running, found by
``vagent.models.remote.ray_session_processes`` (the session folder Ray names after its driver)."""

from __future__ import annotations

import time

import psutil

from vagent.models.remote import ray_session_processes


def session_processes(driver_pid: int) -> list[str]:
    """Names and command lines (shortened) of the live processes of the Ray session ``driver_pid`` started."""
    out = []
    for p in ray_session_processes(driver_pid):
        try:
            out.append(f"{p.pid} {p.name()}: {' '.join(p.cmdline())[:160]}")
        except (psutil.NoSuchProcess, psutil.AccessDenied):  # it ended meanwhile
            continue
    return out


def outlives(driver_pid: int, seconds: float) -> list[str]:
    """``session_processes(driver_pid)`` once none is left, or as they are after ``seconds``."""
    deadline = time.time() + seconds
    while (alive := session_processes(driver_pid)) and time.time() < deadline:
        time.sleep(0.1)
    return alive
