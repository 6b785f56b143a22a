"""No Ray process outlives the trainer that started the local Ray cluster.

Ray's GCS server and raylet end with the driver that started them, but the agents the raylet
starts (``ray::DashboardAgent``, ``ray::RuntimeEnvAgent``) do not: a SIGKILLed trainer left them
running, reparented to init, one pair per crash. :func:`vagent.models.remote.start_ray` sets two
defenses when it starts a cluster:

- a watchdog (:func:`start_watchdog`): one small process per driver, ``python -m
  vagent.models.ray_reaper PID START_TIME``, in its own session (a kill of the trainer's process
  group spares it), that waits for the driver to end (a pidfd, else a 0.2 s poll) and then SIGKILLs
  every process of the driver's Ray sessions until none is left; it imports only psutil;
- a marker (:func:`mark_session`): ``vagent-driver.json`` (the driver's pid and start time) in
  the session folder. Every later ``start_ray`` on the host, the resume of a crashed run first of
  all, finds the marked sessions whose driver is gone and kills what is left of them
  (:func:`reap_dead_sessions`): the watchdog can have been killed too (a kill of every process of
  the user, the OOM killer). A cluster started with ``ray start`` carries no marker and is never
  touched, nor is a session whose driver still runs.

A session's processes are found by its folder's name (:func:`ray_session_processes`): Ray names it
after the driver (``session_<time>_<pid>``), its daemons name it in their command lines, and
every process of the cluster, the retitled ``ray::`` workers and agents too, holds its log files
open.
"""

from __future__ import annotations

import json
import os
import re
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

#: the marker start_ray writes into the session folder of a cluster it started
MARKER = "vagent-driver.json"


def ray_session_processes(driver_pid: int | None = None, sessions: list[str] | None = None) -> list[Any]:
    """The live processes (``psutil.Process``) of the local Ray sessions that process ``driver_pid``
    started (any ``session_<time>_<driver_pid>``), or of the sessions named in ``sessions``."""
    import psutil

    if sessions is not None:
        mark = re.compile("(?:" + "|".join(re.escape(s) for s in sessions) + r")\b")
    else:
        mark = re.compile(rf"session_[0-9_-]+_{driver_pid}\b")
    found = []
    for proc in psutil.process_iter(["cmdline", "status", "name"]):
        if proc.pid in (driver_pid, os.getpid()) or proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        args = proc.info["cmdline"] or []
        cmdline = " ".join(args)
        if not _is_ray(proc.info["name"] or "", args):
            continue  # e.g. another rank of a job that joined the cluster: it holds a driver log there
        try:
            if mark.search(cmdline) or any(mark.search(f.path) for f in proc.open_files()):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def _is_ray(name: str, args: list[str]) -> bool:
    """Whether a process is one of Ray's: a retitled worker or agent (``ray::...``), a daemon
    binary, or Python running a file of the ray package (log monitor, workers before they retitle):
    the program or the script (its first two arguments) lies in a ``ray`` folder."""
    return name.startswith("ray::") or name in ("raylet", "gcs_server") or any("/ray/" in a for a in args[:2])


def kill_session(driver_pid: int | None = None, sessions: list[str] | None = None, settle_s: float = 1.0,
                 timeout_s: float = 30.0) -> int:
    """SIGKILL the processes of a session (as :func:`ray_session_processes` picks them) until none
    has been seen for ``settle_s`` (a raylet may still be starting an agent) or ``timeout_s`` has
    passed; returns how many were killed."""
    import psutil

    killed: set[int] = set()
    deadline = time.monotonic() + timeout_s
    quiet_since = time.monotonic()
    while time.monotonic() < deadline:
        procs = ray_session_processes(driver_pid, sessions)
        if procs:
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since >= settle_s:
            break
        for proc in procs:
            try:
                proc.kill()
                killed.add(proc.pid)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        time.sleep(0.2)
    return len(killed)


def _alive(pid: int, start_time: float) -> bool:
    """Whether process ``pid`` runs and is the one that started at ``start_time`` (not a reuse)."""
    import psutil

    try:
        proc = psutil.Process(pid)
        return proc.status() != psutil.STATUS_ZOMBIE and abs(proc.create_time() - start_time) < 0.05
    except psutil.NoSuchProcess:
        return False


def wait_for_exit(pid: int, start_time: float, poll_s: float = 0.2) -> None:
    """Return when process ``pid`` (started at ``start_time``) has ended: a pidfd where Linux has
    one (no polling), else a poll every ``poll_s``."""
    fd = None
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pass
    try:
        if not _alive(pid, start_time):  # checked after the pidfd opened: it names this very process
            return
        if fd is not None:
            select.select([fd], [], [])  # readable once the process has exited
            return
        while _alive(pid, start_time):
            time.sleep(poll_s)
    finally:
        if fd is not None:
            os.close(fd)


_watchdog: subprocess.Popen | None = None


def start_watchdog() -> subprocess.Popen:
    """Start this process's watchdog (once per process): it kills what is left of this process's
    Ray sessions when this process ends, however it ends."""
    global _watchdog
    if _watchdog is not None and _watchdog.poll() is None:
        return _watchdog
    import psutil

    me = psutil.Process()
    _watchdog = subprocess.Popen(
        [sys.executable, "-m", "vagent.models.ray_reaper", str(me.pid), repr(me.create_time())],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True, close_fds=True, cwd="/",
        env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)})
    return _watchdog


def mark_session(session_dir: str | Path) -> None:
    """Write the marker (this process's pid and start time) into a session folder it started."""
    import psutil

    me = psutil.Process()
    path = Path(session_dir) / MARKER
    tmp = path.with_name(f".{MARKER}.{me.pid}")
    tmp.write_text(json.dumps({"pid": me.pid, "start_time": me.create_time(), "argv": sys.argv[:8]}))
    os.replace(tmp, path)


def reap_dead_sessions(temp_dir: str | Path) -> tuple[list[str], int]:
    """Kill what is left of the marked sessions under ``temp_dir`` (Ray's temp folder, /tmp/ray by
    default) whose driver has ended, in one pass over the processes, and remove their markers (a
    session is reaped once). Returns (the sessions reaped, processes killed)."""
    dead = []
    for marker in sorted(Path(temp_dir).glob(f"session_*/{MARKER}")):
        if marker.parent.is_symlink():  # session_latest: Ray's link to the newest session, found by its own name
            continue
        try:
            info = json.loads(marker.read_text())
            pid, start = int(info["pid"]), float(info["start_time"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if not _alive(pid, start):
            dead.append(marker)
    if not dead:
        return [], 0
    n = kill_session(sessions=[m.parent.name for m in dead], settle_s=0.5, timeout_s=10.0)
    for marker in dead:
        try:
            marker.unlink()
        except OSError:
            pass
    return [m.parent.name for m in dead], n


def main(argv: list[str] | None = None) -> int:
    """The watchdog: ``python -m vagent.models.ray_reaper PID START_TIME``."""
    import signal

    args = sys.argv[1:] if argv is None else argv
    pid, start = int(args[0]), float(args[1])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C of the trainer is not ours to obey
    wait_for_exit(pid, start)
    kill_session(driver_pid=pid)
    return 0


if __name__ == "__main__":
    sys.exit(main())
