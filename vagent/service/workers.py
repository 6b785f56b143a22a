"""How env operations run off the event loop: the front's thread pool, or worker processes.

:class:`LocalExecutor` (``--workers 1``) runs a :class:`~vagent.service.host.SessionHost` in the
front process's thread pool. :class:`ProcessExecutor` (``--workers W``) runs one host in each of W
spawned worker processes; a session stays on the worker that created it.
"""

from __future__ import annotations

import asyncio
import itertools
import multiprocessing as mp
import pickle
import struct
import sys
from typing import Any, Callable

import anyio

from vagent.service.host import SessionHost, worker_main


class WorkerLost(Exception):
    """A worker process died while running a call (its sessions are gone)."""


class LocalExecutor:
    """Runs env operations in the front process's thread pool (``--workers 1``)."""

    n = 1

    def __init__(self, host: SessionHost) -> None:
        self.host = host

    async def start(self, on_lost: Callable[[int], None]) -> None:
        pass

    async def run(self, worker: int, ops: list[tuple], codec: str = "png") -> list[tuple]:
        return await anyio.to_thread.run_sync(self.host.run_many, ops, codec)

    def pids(self) -> list[int]:
        return []

    async def stop(self) -> None:
        await anyio.to_thread.run_sync(self.host.close_all)


class _Worker:
    def __init__(self, proc: Any, transport: asyncio.WriteTransport) -> None:
        self.proc, self.transport = proc, transport
        self.pending: dict[int, asyncio.Future] = {}
        self.alive = True
        self.task: asyncio.Task | None = None


def _frame(obj: Any) -> bytes:
    """``obj`` pickled in multiprocessing's Connection framing (what ``recv_bytes`` reads)."""
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    n = len(data)
    head = struct.pack("!i", n) if n <= 0x7FFFFFFF else struct.pack("!i", -1) + struct.pack("!Q", n)
    return head + data


class ProcessExecutor:
    """Runs env operations in W worker processes (``--workers W``); a session stays on its worker.

    Each worker has two one-way pipes driven by the event loop itself (asyncio pipe transports:
    writes are buffered, never blocking; a reader task resolves the awaiting futures), so no
    thread hand-off sits between the loop and a worker. Messages are pickled in
    multiprocessing's framing. A dead worker is replaced and its sessions reported lost through
    ``on_lost``.
    """

    def __init__(self, n: int, imports: tuple[str, ...], allowed: tuple[str, ...], png_level: int,
                 env_config: dict[str, dict[str, Any]] | None = None) -> None:
        self.n = n
        self.args = (imports, allowed, png_level, dict(env_config or {}))
        self.ctx = mp.get_context("spawn")
        self.workers: list[_Worker] = []
        self.ids = itertools.count()
        self.on_lost: Callable[[int], None] = lambda k: None
        self.stopping = False

    async def start(self, on_lost: Callable[[int], None]) -> None:
        self.on_lost = on_lost
        self.workers = [await self._spawn(k) for k in range(self.n)]

    async def _spawn(self, k: int) -> _Worker:
        req_r, req_w = self.ctx.Pipe(duplex=False)
        resp_r, resp_w = self.ctx.Pipe(duplex=False)
        proc = self.ctx.Process(target=worker_main, args=(req_r, resp_w, *self.args, k),
                                name=f"vagent-env-worker-{k}", daemon=True)
        proc.start()
        req_r.close()
        resp_w.close()  # the worker holds the only write end: its death is EOF here
        loop = asyncio.get_running_loop()
        transport, _ = await loop.connect_write_pipe(asyncio.BaseProtocol, req_w)
        reader = asyncio.StreamReader()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), resp_r)
        w = _Worker(proc, transport)
        w.task = asyncio.create_task(self._read(k, w, reader))
        return w

    async def _read(self, k: int, w: _Worker, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                (n,) = struct.unpack("!i", await reader.readexactly(4))
                if n == -1:
                    (n,) = struct.unpack("!Q", await reader.readexactly(8))
                req_id, results = pickle.loads(await reader.readexactly(n))
                fut = w.pending.pop(req_id, None)
                if fut is not None and not fut.done():
                    fut.set_result(results)
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        await self._lost(k, w)

    async def _lost(self, k: int, w: _Worker) -> None:
        if not w.alive:
            return
        w.alive = False
        w.transport.close()
        for fut in w.pending.values():
            if not fut.done():
                fut.set_exception(WorkerLost(f"env worker {k} (pid {w.proc.pid}) died"))
        w.pending.clear()
        if self.stopping:
            return
        self.on_lost(k)
        print(f"vagent serve-env: env worker {k} (pid {w.proc.pid}) died; its sessions are lost "
              "(clients replay them); starting a new one", file=sys.stderr, flush=True)
        await asyncio.to_thread(w.proc.join, 5)
        self.workers[k] = await self._spawn(k)

    async def run(self, worker: int, ops: list[tuple], codec: str = "png") -> list[tuple]:
        w = self.workers[worker]
        if not w.alive:
            raise WorkerLost(f"env worker {worker} is restarting")
        req_id = next(self.ids)
        fut = asyncio.get_running_loop().create_future()
        w.pending[req_id] = fut
        w.transport.write(_frame((req_id, ops, codec)))
        return await fut

    def pids(self) -> list[int]:
        return [w.proc.pid for w in self.workers]

    async def stop(self) -> None:
        self.stopping = True
        for w in self.workers:
            if w.alive:
                w.transport.write(_frame(None))
        for w in self.workers:
            await asyncio.to_thread(w.proc.join, 5)
            if w.proc.is_alive():
                w.proc.terminate()
                await asyncio.to_thread(w.proc.join, 2)
            w.transport.close()
            if w.task is not None:
                w.task.cancel()
