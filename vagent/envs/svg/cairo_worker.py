"""cairosvg for the SVG env: in this process, or in a persistent worker process with a timeout.

:func:`cairosvg_png` renders with no URL access (every fetch returns an empty image).
``_WORKER`` is the one worker client per Python process, shared by all envs behind a lock: it
starts ``vagent.envs.svg.render_worker`` (from a long-lived spawner thread, so the worker's
``PR_SET_PDEATHSIG`` ties it to this process, not to a pool thread), talks length-prefixed
frames to it, kills it on a timeout or crash (the next render restarts it) and forgets it in a
forked child (which starts its own). See :mod:`vagent.envs.svg.render` for the guards around it.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import json
import os
import queue
import select
import struct
import subprocess
import sys
import threading
import time
from typing import Any

from vagent.envs.base import EnvError

_EMPTY_SVG = b'<svg xmlns="http://www.w3.org/2000/svg" width="1" height="1"></svg>'
_START_TIMEOUT_S = 60.0  # the worker imports cairosvg before it is ready


def _refuse_fetch(url: str, resource_type: str) -> bytes:  # noqa: ARG001 - cairosvg's fetcher signature
    """cairosvg url_fetcher: nothing is ever fetched (file, network or data: URLs)."""
    return _EMPTY_SVG


def cairosvg_png(svg: bytes, width: int, height: int) -> bytes:
    """PNG bytes of ``svg`` rendered by cairosvg at ``width`` x ``height`` with no URL access.

    Percent sizes resolve against the output size. Raises whatever cairosvg raises."""
    from cairosvg.surface import PNGSurface

    return PNGSurface.convert(bytestring=svg, output_width=width, output_height=height, parent_width=width,
                              parent_height=height, unsafe=False, url_fetcher=_refuse_fetch)


def _describe_exception(exc: BaseException) -> str:
    msg = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {msg}" if msg else type(exc).__name__


class RendererUnavailable(EnvError):
    """The renderer itself cannot run (the worker does not start): an environment error, not the SVG's fault."""


class _Spawner:
    """Starts render workers from one long-lived daemon thread.

    The worker asks the kernel for SIGKILL when its parent dies (``PR_SET_PDEATHSIG``), and Linux
    counts the *thread* that forked it as the parent: a worker started from a pool thread (the
    env server runs envs in anyio's threads, which exit when idle) would be killed when that
    thread exits. Forking from this thread, which lives as long as the process, ties the
    worker's life to the process.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.jobs: queue.SimpleQueue | None = None

    def popen(self, cmd: list[str], **kwargs: Any) -> subprocess.Popen:
        with self.lock:
            if self.jobs is None:
                self.jobs = queue.SimpleQueue()
                threading.Thread(target=self._serve, args=(self.jobs,), name="svg-render-spawner", daemon=True).start()
            jobs = self.jobs
        done: concurrent.futures.Future = concurrent.futures.Future()
        jobs.put((done, cmd, kwargs))
        return done.result()

    @staticmethod
    def _serve(jobs: queue.SimpleQueue) -> None:
        while True:
            done, cmd, kwargs = jobs.get()
            try:
                done.set_result(subprocess.Popen(cmd, **kwargs))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                done.set_exception(exc)


_SPAWNER = _Spawner()


class _Worker:
    """A persistent ``render_worker`` subprocess speaking length-prefixed frames on stdin/stdout.

    Request: ``>II`` (header length, svg length) + JSON header ``{"w", "h"}`` + svg bytes.
    Reply: ``>II`` (header length, png length) + JSON header ``{"error"}`` + png bytes.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.proc: subprocess.Popen | None = None
        self.memory_mb = 0
        self.starts = 0

    def _start(self, memory_mb: int) -> subprocess.Popen:
        """Start the worker and wait for its ready frame (it imports cairosvg first); raises
        RendererUnavailable if it cannot start."""
        cmd = [sys.executable, "-m", "vagent.envs.svg.render_worker", "--max-memory-mb", str(memory_mb),
               "--parent-pid", str(os.getpid())]
        env = dict(os.environ)  # the worker imports this very vagent, however this process found it
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
        self.proc = _SPAWNER.popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                   env=env)
        self.memory_mb = memory_mb
        self.starts += 1
        try:
            meta, _ = self._read_frame(time.monotonic() + _START_TIMEOUT_S)
        except EOFError:
            meta = None
        if meta is None or meta.get("error"):
            self.kill()
            why = meta.get("error") if meta else f"no ready frame within {_START_TIMEOUT_S:g} s"
            raise RendererUnavailable(
                f"the SVG render worker failed to start ({why}); check `{sys.executable} -m "
                "vagent.envs.svg.render_worker` runs, install cairosvg + libcairo2, or use renderer='pil'")
        return self.proc

    def kill(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
        if proc is not None:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:  # pragma: no cover - a killed process always exits
                pass
            for stream in (proc.stdin, proc.stdout):
                try:
                    stream.close()
                except OSError:
                    pass

    def _read_exact(self, fd: int, n: int, deadline: float) -> bytes | None:
        chunks, got = [], 0
        while got < n:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                return None
            chunk = os.read(fd, min(n - got, 1 << 20))
            if not chunk:
                raise EOFError("the render worker exited")
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    def _read_frame(self, deadline: float) -> tuple[dict | None, bytes]:
        """(header, payload) of the next frame, or (None, b"") at the deadline; EOFError if the
        worker exited."""
        fd = self.proc.stdout.fileno()
        head = self._read_exact(fd, 8, deadline)
        if head is None:
            return None, b""
        n_header, n_payload = struct.unpack(">II", head)
        body = self._read_exact(fd, n_header + n_payload, deadline)
        if body is None:
            return None, b""
        return json.loads(body[:n_header]), body[n_header:]

    def render(self, svg: bytes, width: int, height: int, timeout_s: float, memory_mb: int) -> tuple[bytes | None, str | None]:
        """(png, None) or (None, error)."""
        with self.lock:
            if self.proc is None or self.proc.poll() is not None or self.memory_mb != memory_mb:
                self.kill()
                self._start(memory_mb)
            header = json.dumps({"w": width, "h": height, "timeout_s": timeout_s}).encode()
            try:
                self.proc.stdin.write(struct.pack(">II", len(header), len(svg)) + header + svg)
                self.proc.stdin.flush()
                meta, png = self._read_frame(time.monotonic() + timeout_s)
            except (OSError, EOFError, ValueError) as exc:
                self.kill()
                return None, f"the renderer crashed on this SVG ({type(exc).__name__}); simplify it"
            if meta is None:
                self.kill()
                return None, f"render timed out after {timeout_s:g} s; draw fewer or simpler shapes"
            if meta.get("error"):
                return None, str(meta["error"])
            return png, None


_WORKER = _Worker()
atexit.register(_WORKER.kill)


def _forget_worker_after_fork() -> None:
    """A forked child must not talk to its parent's worker (their frames would interleave): it
    drops the handle (without killing the parent's worker) and starts its own on first use."""
    _WORKER.lock = threading.Lock()
    _WORKER.proc = None
    _SPAWNER.lock = threading.Lock()
    _SPAWNER.jobs = None  # the spawner thread does not exist in the child


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_worker_after_fork)


def worker_starts() -> int:
    """How many times this process started the render worker (a restart follows a timeout or crash)."""
    return _WORKER.starts


__all__ = ["RendererUnavailable", "cairosvg_png", "worker_starts"]
