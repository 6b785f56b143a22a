"""Real env servers on loopback for the service tests: subprocesses on free ports."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import httpx
import pytest

from tests.service import toyenv  # noqa: F401 - registers the toy envs in this process too
from vagent.envs import make

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "test-token-0123456789"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(proc: subprocess.Popen, url: str, timeout: float, output: Callable[[], str]) -> None:
    """Return once ``url + "/health"`` answers 200; RuntimeError with the server's ``output()`` when
    ``proc`` exits first or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{output()}")
        try:
            if httpx.get(url + "/health", timeout=1.0).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.05)
    raise RuntimeError(f"server on {url} not ready after {timeout}s:\n{output()}")


def stop_process(proc: subprocess.Popen, timeout: float) -> None:
    """SIGTERM, and SIGKILL when ``proc`` has not exited ``timeout`` seconds later."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


class ServerProc:
    """``python -m vagent.service.server`` in a subprocess (the toy and faulty test envs imported)."""

    def __init__(self, *args: str, port: int | None = None, log_dir: Path | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.args, self.port, self.env = list(args), port or free_port(), env
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.log_path = (log_dir or Path("/tmp")) / f"vagent-svc-{self.port}-{os.getpid()}.log"

    def start(self, wait: bool = True) -> "ServerProc":
        cmd = [sys.executable, "-m", "vagent.service.server", "--port", str(self.port),
               "--import", "tests.service.toyenv", "--import", "tests.service.faultyenvs", *self.args]
        self.log = open(self.log_path, "ab")
        env = {**os.environ, **self.env} if self.env else None
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self, timeout: float = 30.0) -> None:
        assert self.proc is not None
        wait_healthy(self.proc, self.url, timeout, self.output)

    def output(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def kill(self) -> None:
        """SIGKILL: no shutdown, no goodbye (a crash)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            stop_process(self.proc, 10)
        if getattr(self, "log", None):
            self.log.close()

    def metrics(self, token: str | None = None) -> dict:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.get(self.url + "/metrics", headers=headers, timeout=5).json()


@pytest.fixture
def start_server(tmp_path):
    """Factory: start_server(*args, port=None) -> a ready ServerProc, stopped after the test."""
    started: list[ServerProc] = []

    def start(*args: str, port: int | None = None, wait: bool = True, env: dict[str, str] | None = None) -> ServerProc:
        s = ServerProc(*args, port=port, log_dir=tmp_path, env=env)
        started.append(s)
        return s.start(wait=wait)

    yield start
    for s in started:
        s.stop()


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    """One plain server (no token, one worker) shared by the tests that do not break it."""
    s = ServerProc(log_dir=tmp_path_factory.mktemp("svc")).start()
    yield s
    s.stop()


@pytest.fixture(scope="session")
def auth_server(tmp_path_factory):
    """A server with a bearer token, shared by the bad-input tests (body limit: the default 1 MiB)."""
    s = ServerProc("--token", TOKEN, log_dir=tmp_path_factory.mktemp("svc")).start()
    yield s
    s.stop()


def image_bytes(obs: Any) -> list[tuple[str, tuple[int, int], bytes]]:
    return [(im.mode, im.size, im.tobytes()) for im in obs.images]


def transcript_of(env: Any, seed: int, replies: list[str]) -> list[tuple]:
    """(text, image bytes, reward, terminated, truncated, info) of each step; stops at the end."""
    obs, info = env.reset(seed)
    out = [(obs.text, image_bytes(obs), None, None, None, _plain(info))]
    for reply in replies:
        r = env.step(reply)
        out.append((r.obs.text, image_bytes(r.obs), r.reward, r.terminated, r.truncated, _plain(r.info)))
        if r.terminated or r.truncated:
            break
    return out


def _plain(info: dict) -> Any:
    """info as it travels (JSON): tuples become lists, the documented deviation."""
    return json.loads(json.dumps(info))


def local_transcript(name: str, config: dict, seed: int, replies: list[str]) -> list[tuple]:
    env = make(name, **config)
    try:
        return transcript_of(env, seed, replies)
    finally:
        env.close()


def replies_for(names: tuple[str, ...], n: int, seed: int) -> list[str]:
    """A seeded mixture of valid moves, multi-action answers and invalid replies (no_think)."""
    import random

    rng = random.Random(seed)
    out = []
    for _ in range(n):
        kind = rng.random()
        if kind < 0.7:
            out.append(f"<answer>{rng.choice(names)}</answer>")
        elif kind < 0.85:
            out.append(f"<answer>{rng.choice(names)},{rng.choice(names)}</answer>")
        else:
            out.append(rng.choice(["no tags at all", "<answer>jump</answer>", "<answer></answer>"]))
    return out
