"""A local Ray cluster's processes are found by the session folder Ray names after its driver, the
retitled ``ray::`` workers and agents included, so a failed start (``start_ray`` retries after a
raylet that did not register) kills all of them rather than leaving orphans; a SIGKILLed driver
leaves none behind (its watchdog), and the next start reaps a crashed driver's leftovers (~20 s).
The crash test's clusters live in a Ray temp folder of its own, so no other run on the host reaps
what it watches."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

pytest.importorskip("ray", reason="the local Ray cluster needs the ray extra: pip install 'vagent[ray]'")

DRIVER = """
import os, time
from vagent.models.remote import _kill_own_ray_processes, ray_session_processes, start_ray

ray = start_ray(1)
time.sleep(3)  # a prestarted worker would be up by now
print("workers before any task", sum(p.name().startswith("ray::IDLE") for p in ray_session_processes(os.getpid())))
worker, nice = ray.get(ray.remote(lambda: (os.getpid(), os.nice(0))).remote())
print("worker", worker)
print("nice", nice, os.nice(0))
for p in ray_session_processes(os.getpid()):
    print("found", p.pid, p.name())
_kill_own_ray_processes()
deadline = time.time() + 10
while ray_session_processes(os.getpid()) and time.time() < deadline:
    time.sleep(0.1)
print("left", len(ray_session_processes(os.getpid())))
os._exit(0)  # ray.shutdown() would wait for the processes killed above
"""


@pytest.mark.timeout(600)
def test_every_process_of_the_session_is_found_and_killed(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    out = subprocess.run([sys.executable, "-c", DRIVER], capture_output=True, text=True, timeout=480)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [line.split() for line in out.stdout.splitlines()]
    worker = int(next(w[1] for w in lines if w[0] == "worker"))
    found = {int(w[1]): w[2] for w in lines if w[0] == "found"}
    assert found.get(worker, "").startswith("ray::"), found  # a retitled task worker
    # workers (engine replicas) run at the driver's priority, not Ray's default +15, which a busy machine starves
    nice = next(w[1:] for w in lines if w[0] == "nice")
    assert nice[0] == nice[1], f"a Ray worker runs at niceness {nice[0]}, its driver at {nice[1]}"
    # no idle worker is started ahead of demand (each costs its start-up; vagent's work runs in actors)
    assert ["workers", "before", "any", "task", "0"] in lines, out.stdout
    assert {"raylet", "gcs_server"} <= set(found.values()), found
    assert ["left", "0"] in lines, out.stdout
    assert not [pid for pid in found if _running(pid)], "a killed process still runs"


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


# --- a SIGKILLed driver leaves nothing behind (issue 47, item 12) ---------------------------------

STAY = """
import os, time
from vagent.models import ray_reaper
from vagent.models.remote import ray_session_processes, start_ray

ray = start_ray(1)


@ray.remote
class Replica:
    def pid(self):
        return os.getpid()


replica = Replica.remote()
ray.get(replica.pid.remote())
for p in ray_session_processes(os.getpid()):
    print("found", p.pid, p.name(), flush=True)
print("watchdog", ray_reaper._watchdog.pid, flush=True)
print("ready", flush=True)
time.sleep(900)
"""


def _driver() -> tuple[subprocess.Popen, dict[int, str], int]:
    """A driver that started a local cluster and an actor: (its process, the session's processes
    by pid, its watchdog's pid)."""
    proc = subprocess.Popen([sys.executable, "-c", STAY], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    found, watchdog = {}, 0
    for line in proc.stdout:
        word = line.split()
        if word and word[0] == "found":
            found[int(word[1])] = word[2]
        elif word and word[0] == "watchdog":
            watchdog = int(word[1])
        elif word == ["ready"]:
            return proc, found, watchdog
    raise AssertionError(f"the driver ended before its cluster was ready:\n{proc.stderr.read()[-3000:]}")


def _wait_gone(pids, timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = [pid for pid in pids if _running(pid)]
        if not left:
            return []
        time.sleep(0.2)
    return left


def _marked_sessions(temp: Path) -> dict[str, int]:
    """The marked sessions under Ray's temp folder ``temp``: session folder name -> driver pid."""
    from vagent.models.ray_reaper import MARKER

    return {m.parent.name: json.loads(m.read_text())["pid"] for m in temp.glob(f"session_*/{MARKER}")
            if not m.parent.is_symlink()}  # not session_latest, Ray's link to the newest


@pytest.mark.timeout(900)
def test_a_killed_driver_leaves_no_ray_process_and_the_next_start_reaps_a_crash(monkeypatch, own_ray_temp):
    """Two real SIGKILLs. (1) Driver A and its watchdog killed (as a kill of every process of the
    user would): Ray's agents survive, reparented to init (the finding); the next driver's
    start_ray (a resume) kills them. (2) Driver B alone killed: its watchdog kills every process of
    B's cluster, agents included, and ends. Where Ray itself ends the agents with their driver,
    (1) has nothing to reap and is skipped, with the reason."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    everything: list[int] = []
    try:
        a, found_a, watchdog_a = _driver()
        everything += [*found_a, watchdog_a]
        assert {"ray::DashboardAgent", "ray::RuntimeEnvAgent"} <= set(found_a.values()), found_a
        assert list(_marked_sessions(own_ray_temp).values()) == [a.pid]  # A's cluster, in this test's folder
        os.kill(watchdog_a, signal.SIGKILL)
        a.kill()
        a.wait(timeout=30)
        time.sleep(3)
        agents = [pid for pid, name in found_a.items() if name in ("ray::DashboardAgent", "ray::RuntimeEnvAgent")]
        if not [pid for pid in agents if _running(pid)]:  # no reaper looks at this folder: Ray ended them
            pytest.skip("Ray's agents ended with their killed driver on this host (Ray's own doing: no reaper "
                        "watches this test's temp folder), so a crash leaves nothing to reap here")

        b, found_b, watchdog_b = _driver()  # its start_ray reaps A's leftovers first
        everything += [*found_b, watchdog_b]
        assert not _wait_gone(found_a, 5), {p: found_a[p] for p in found_a if _running(p)}
        assert list(_marked_sessions(own_ray_temp).values()) == [b.pid]  # A's reaped once: its marker is gone
        b.kill()
        b.wait(timeout=30)
        left = _wait_gone([*found_b, watchdog_b], 30)
        assert not left, {p: found_b.get(p, "watchdog") for p in left}
    finally:
        for pid in everything:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def test_only_rays_own_processes_are_taken_for_a_sessions():
    """A rank of a job that joined the cluster holds a driver log in the session folder, but it is
    the job's, not Ray's: the reaper never kills it."""
    from vagent.models.ray_reaper import _is_ray

    site = "/x/site-packages/ray"
    assert _is_ray("raylet", [f"{site}/core/src/ray/raylet/raylet", "--raylet_socket_name=/tmp/ray/s/sockets/raylet"])
    assert _is_ray("ray::DashboardAgent", ["ray::DashboardAgent"])
    assert _is_ray("python", ["/usr/bin/python", f"{site}/_private/log_monitor.py", "--session-dir=/tmp/ray/s"])
    assert not _is_ray("python", ["/usr/bin/python", "-m", "vagent", "train", "out_dir=/data/ray/runs"])
    assert not _is_ray("tail", ["tail", "-f", "/tmp/ray/session_1_2/logs/raylet.out"])
