"""A local Ray cluster's processes are found by the session folder Ray names after its driver, the
retitled ``ray::`` workers and agents included, so a failed start (``start_ray`` retries after a
raylet that did not register) kills all of them rather than leaving orphans."""

from __future__ import annotations

import subprocess
import sys

import psutil
import pytest

pytest.importorskip("ray", reason="the local Ray cluster needs the ray extra: pip install 'vagent[ray]'")

DRIVER = """
import os, time
from vagent.models.remote import _kill_own_ray_processes, ray_session_processes, start_ray

ray = start_ray(1)
worker = ray.get(ray.remote(lambda: os.getpid()).remote())
print("worker", worker)
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
    assert {"raylet", "gcs_server"} <= set(found.values()), found
    assert ["left", "0"] in lines, out.stdout
    assert not [pid for pid in found if _running(pid)], "a killed process still runs"


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
