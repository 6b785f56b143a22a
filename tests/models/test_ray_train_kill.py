"""A SIGKILLed ``vagent train ... rollout.replicas=1`` after its first checkpoint leaves no process of
its Ray cluster behind (``ray::DashboardAgent`` and ``ray::RuntimeEnvAgent`` outlived it before,
reparented to init), and the resume finishes (~40 s on 2 busy cores). The trainer's cluster lives
in a Ray temp folder of the test's own (``own_ray_temp``), so no other run on the host reaps what
the watchdog must kill: a broken watchdog cannot hide behind another run's reaper."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.distributed.conftest import SMALL, run_job, train_cmd
from tests.waiting import wait_for_file
from vagent.models.ray_reaper import MARKER, ray_session_processes

pytest.importorskip("ray", reason="engine replicas need the ray extra: pip install 'vagent[ray]'")


def _left(driver_pid: int, timeout: float) -> list[str]:
    """The names of the driver's Ray processes still running after up to ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        procs = ray_session_processes(driver_pid)
        if not procs or time.monotonic() > deadline:
            return [f"{p.pid} {p.name()}" for p in procs]
        time.sleep(0.5)


@pytest.mark.timeout(900)
def test_a_killed_trainer_with_replicas_leaves_no_ray_process(tmp_path: Path, tiny_vlm_dir: Path, monkeypatch,
                                                              own_ray_temp: Path):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    out = tmp_path / "runs"
    cmd = train_cmd(None, *SMALL, "steps=3", "rollout.replicas=1", f"out_dir={out}", f"model.path={tiny_vlm_dir}",
                    "model.cache_dir=UNUSED")
    job = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1"))
    try:
        wait_for_file(job, out, "*/checkpoints/step_000001/state.pt", "its first checkpoint", 400)
        names = {p.name() for p in ray_session_processes(job.pid)}
        assert {"ray::DashboardAgent", "ray::RuntimeEnvAgent"} <= names, names
        assert list(own_ray_temp.glob(f"session_*_{job.pid}/{MARKER}")), f"not marked in {own_ray_temp}"
        job.send_signal(signal.SIGKILL)  # the trainer alone, as the OOM killer would
        job.wait(timeout=30)
        assert not _left(job.pid, 30), "processes of the killed trainer's Ray cluster still run"
    finally:
        if job.poll() is None:
            job.kill()
        for p in ray_session_processes(job.pid):
            p.kill()
    (run,) = list(out.iterdir())
    run_job(train_cmd(None, "--resume", str(run)), tmp_path, timeout=400)  # starts a cluster again
    assert (run / "checkpoints" / "step_000003" / "state.pt").is_file()
