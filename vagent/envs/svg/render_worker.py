"""The SVG render worker process: ``python -m vagent.envs.svg.render_worker [--max-memory-mb N]``.

Started by :mod:`vagent.envs.svg.cairo_worker` (never by hand). It limits its own address space, imports
cairosvg, writes a ready frame, then answers render requests on stdin/stdout until stdin closes.
Frames: ``>II`` (header length, payload length) + JSON header + payload. Request header
``{"w", "h", "timeout_s"}`` with the SVG bytes; reply header ``{"error"}`` with PNG bytes.

It never outlives its parent and enforces its own time limit, whatever the parent does:

- ``PR_SET_PDEATHSIG`` (Linux, via ``prctl``): the kernel SIGKILLs it when the parent thread that
  started it exits (the parent starts workers from one long-lived thread, see cairo_worker.py), even
  while cairo runs in C;
- a watchdog thread exits the process when its parent PID changes (the parent died: any POSIX)
  or when a render runs past ``timeout_s`` + :data:`GRACE_S` (the parent normally kills it at
  ``timeout_s``; this is the backstop if the parent is stuck or gone);
- ``RLIMIT_CPU`` is set before each render to the CPU time used so far + ``timeout_s`` + 1 s, so
  the kernel ends a render that holds the GIL in C code (SIGXCPU).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import struct
import sys
import threading
import time

#: seconds past a request's timeout_s after which the worker ends itself (the parent kills it at timeout_s)
GRACE_S = 1.0
#: seconds between the watchdog's checks of the parent and the render deadline
WATCH_PERIOD_S = 0.05
PR_SET_PDEATHSIG = 1


def _read_exact(stream, n: int) -> bytes | None:
    data = b""
    while len(data) < n:
        chunk = stream.read(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def _write(stream, header: dict, payload: bytes = b"") -> None:
    blob = json.dumps(header).encode()
    stream.write(struct.pack(">II", len(blob), len(payload)) + blob + payload)
    stream.flush()


def _limit_memory(mb: int) -> None:
    if mb <= 0:
        return
    try:
        import resource
    except ImportError:  # pragma: no cover - not POSIX
        return
    limit = mb * 1024 * 1024
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def die_with_parent(parent_pid: int) -> None:
    """Ask the kernel to SIGKILL this process when its parent exits (Linux; a no-op elsewhere), then
    exit at once if the parent is already gone (it may have died before the prctl)."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):  # pragma: no cover - no libc prctl: the watchdog still runs
            pass
    if parent_pid and os.getppid() != parent_pid:
        os._exit(0)


class Watchdog:
    """A daemon thread that ends the process when the parent changes or a render overruns."""

    def __init__(self, parent_pid: int) -> None:
        self.parent_pid = parent_pid
        self.deadline: float | None = None
        threading.Thread(target=self._run, name="render-watchdog", daemon=True).start()

    def _run(self) -> None:
        while True:
            time.sleep(WATCH_PERIOD_S)
            if self.parent_pid and os.getppid() != self.parent_pid:
                os._exit(0)
            deadline = self.deadline
            if deadline is not None and time.monotonic() > deadline:
                os._exit(3)


def _limit_cpu(timeout_s: float) -> None:
    """Let the next render use at most ``timeout_s`` + 1 s more CPU time (the kernel sends SIGXCPU)."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not POSIX
        return
    usage = resource.getrusage(resource.RUSAGE_SELF)
    soft = math.ceil(usage.ru_utime + usage.ru_stime + timeout_s) + 1
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-memory-mb", type=int, default=1024)
    parser.add_argument("--parent-pid", type=int, default=0, help="exit when this process is no longer the parent")
    args = parser.parse_args(argv)
    die_with_parent(args.parent_pid)
    watchdog = Watchdog(args.parent_pid)
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing but frames on the real stdout
    try:
        from vagent.envs.svg.cairo_worker import _describe_exception, cairosvg_png

        import cairosvg  # noqa: F401 - fail now (ready frame) rather than on the first request
    except Exception as exc:  # noqa: BLE001 - OSError when libcairo is missing
        _write(stdout, {"error": f"{type(exc).__name__}: {exc}"})
        return 1
    _limit_memory(args.max_memory_mb)
    _write(stdout, {"ready": True})
    while True:
        head = _read_exact(stdin, 8)
        if head is None:
            return 0
        n_header, n_svg = struct.unpack(">II", head)
        body = _read_exact(stdin, n_header + n_svg)
        if body is None:
            return 0
        req = json.loads(body[:n_header])
        timeout_s = float(req.get("timeout_s") or 0)
        if timeout_s > 0:
            _limit_cpu(timeout_s)
            watchdog.deadline = time.monotonic() + timeout_s + GRACE_S
        try:
            png = cairosvg_png(body[n_header:], int(req["w"]), int(req["h"]))
        except MemoryError:
            _write(stdout, {"error": "the SVG needs too much memory to render; simplify it"})
        except Exception as exc:  # noqa: BLE001 - any cairosvg failure is the SVG's fault
            _write(stdout, {"error": f"the SVG could not be rendered ({_describe_exception(exc)})"})
        else:
            _write(stdout, {"error": None}, png)
        finally:
            watchdog.deadline = None


if __name__ == "__main__":
    sys.exit(main())
