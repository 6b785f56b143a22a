"""The env server's session table: which worker holds each session, and the calls on them.

:class:`Front` owns the executor (the front's thread pool with ``--workers 1``, else worker
processes), routes each call by session id under that session's lock, admits creates up to
``--max-sessions``, expires idle sessions (a background sweeper) and forgets the sessions of a
worker that died (they answer 404; the call in flight 503). HTTP is :mod:`vagent.service.server`.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import secrets
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from vagent.service import protocol as P
from vagent.service.config import ServerConfig
from vagent.service.connections import ConnectionLimits
from vagent.service.host import SessionHost
from vagent.service.metrics import Metrics, rss_bytes
from vagent.service.responses import ApiError
from vagent.service.workers import LocalExecutor, ProcessExecutor, WorkerLost


@dataclass
class _Entry:
    """A session of the table: the worker that holds it, its env, its lock, when it was last used."""

    worker: int
    env: str
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    last_used: float = field(default_factory=time.monotonic)


class Front:
    """The server's state: the session table, the executor, the metrics and the sweeper."""

    def __init__(self, cfg: ServerConfig) -> None:
        self.cfg = cfg
        allowed = tuple(cfg.envs)
        if cfg.workers == 1:
            self.executor: Any = LocalExecutor(SessionHost(allowed, cfg.png_level, cfg.env_config))
        else:
            self.executor = ProcessExecutor(cfg.workers, tuple(cfg.imports), allowed, cfg.png_level, cfg.env_config)
        self.connections = ConnectionLimits(cfg.header_timeout, cfg.read_timeout, cfg.max_connections_per_client)
        self.table: dict[str, _Entry] = {}
        self.reserved = 0
        self.metrics = Metrics()
        self.next_worker = itertools.cycle(range(cfg.workers))
        self.sweeper: asyncio.Task | None = None

    # -- lifecycle
    async def start(self) -> None:
        await self.executor.start(self._worker_lost)
        self.sweeper = asyncio.create_task(self._sweep())

    async def stop(self) -> None:
        if self.sweeper:
            self.sweeper.cancel()
        await self.executor.stop()

    def _worker_lost(self, k: int) -> None:
        lost = [sid for sid, e in self.table.items() if e.worker == k]
        for sid in lost:
            del self.table[sid]
        self.metrics.counts["sessions_lost"] += len(lost)
        self.metrics.counts["worker_restarts"] += 1

    async def _sweep(self) -> None:
        period = max(0.05, min(self.cfg.session_ttl / 4, 5.0))
        while True:
            await asyncio.sleep(period)
            now = time.monotonic()
            expired = [(sid, e) for sid, e in self.table.items()
                       if now - e.last_used > self.cfg.session_ttl and not e.lock.locked()]
            by_worker: dict[int, list[tuple]] = {}
            for sid, e in expired:
                del self.table[sid]
                by_worker.setdefault(e.worker, []).append(("close", sid))
            self.metrics.counts["sessions_expired"] += len(expired)
            for k, ops in by_worker.items():
                try:
                    await self.executor.run(k, ops)
                except WorkerLost:
                    pass

    # -- helpers
    def admit(self, n: int) -> None:
        if len(self.table) + self.reserved + n > self.cfg.max_sessions:
            self.metrics.counts["admission_rejects"] += 1
            raise ApiError(503, "Busy", f"the server holds {len(self.table)} of at most {self.cfg.max_sessions} "
                           f"sessions; close sessions or retry later (Retry-After).", {"Retry-After": "1"})

    def entry(self, sid: str) -> _Entry:
        e = self.table.get(sid)
        if e is None:
            raise ApiError(404, "UnknownSession", _unknown(sid))
        return e

    async def _run(self, worker: int, ops: list[tuple], codec: str = "png") -> list[tuple]:
        try:
            return await self.executor.run(worker, ops, codec)
        except WorkerLost as exc:
            raise ApiError(503, "Busy", f"{exc}; its sessions were lost and it is restarting; retry "
                           "(RemoteEnv recreates and replays the session).", {"Retry-After": "1"}) from exc

    def _account(self, op: str, sid: str, res: tuple) -> None:
        if res[0] == "ok":
            if op == "step":
                self.metrics.counts["steps"] += 1
            elif op == "reset":
                self.metrics.counts["resets"] += 1
            return
        status, body = res[1], res[2]
        if status >= 500:
            self.metrics.counts["env_errors"] += 1
        if body.get("session_closed") and self.table.pop(sid, None) is not None:
            self.metrics.counts["sessions_closed"] += 1

    async def session_op(self, sid: str, op: str, *args: Any, codec: str = "png") -> tuple:
        """One operation on one session under its lock; keeps the table in step with the host."""
        e = self.entry(sid)
        async with e.lock:
            if self.table.get(sid) is not e:
                raise ApiError(404, "UnknownSession", _unknown(sid))
            e.last_used = time.monotonic()
            [res] = await self._run(e.worker, [(op, sid, *args)], codec)
            e.last_used = time.monotonic()
            if op == "close" and res[0] == "ok":
                self.table.pop(sid, None)
                self.metrics.counts["sessions_closed"] += 1
            self._account(op, sid, res)
            return res

    async def create_many(self, reqs: list[P.CreateRequest], codec: str = "png") -> list[tuple]:
        self.admit(len(reqs))
        self.reserved += len(reqs)
        try:
            plan: dict[int, list[tuple[int, tuple]]] = {}
            for i, r in enumerate(reqs):
                k = next(self.next_worker)
                sid = f"w{k}-{secrets.token_urlsafe(18)}"
                plan.setdefault(k, []).append((i, ("create", sid, r.env, r.config, r.seed, r.replay, r.config_hash)))
            results: list[tuple] = [()] * len(reqs)
            done = await asyncio.gather(*(self._run(k, [op for _, op in items], codec) for k, items in plan.items()),
                                        return_exceptions=True)
            for (k, items), out in zip(plan.items(), done):
                if isinstance(out, BaseException):
                    err = out if isinstance(out, ApiError) else ApiError(503, "Busy", str(out))
                    for i, _ in items:
                        results[i] = err.result()
                    continue
                for (i, op), res in zip(items, out):
                    results[i] = res
                    if res[0] == "ok":
                        self.table[op[1]] = _Entry(worker=k, env=op[2])
                        self.metrics.counts["sessions_created"] += 1
                        if op[5]:
                            self.metrics.counts["replays_served"] += 1
                    elif res[1] >= 500:
                        self.metrics.counts["env_errors"] += 1
            return results
        finally:
            self.reserved -= len(reqs)

    async def batch_op(self, op: str, items: list[tuple[str, tuple]], codec: str = "png") -> list[tuple]:
        """``op`` on many sessions (``items``: (session_id, args)); per-item results in order."""
        sids = [sid for sid, _ in items]
        dup = [s for s, n in Counter(sids).items() if n > 1]
        if dup:
            raise ApiError(422, "ValidationError", f"session '{dup[0][:80]}' appears more than once in one batch; "
                           "send each session at most once per batch (its calls must run in order).")
        results: list[tuple] = [()] * len(items)
        entries: dict[str, _Entry] = {}
        for i, sid in enumerate(sids):
            e = self.table.get(sid)
            if e is None:
                results[i] = ApiError(404, "UnknownSession", _unknown(sid)).result()
            else:
                entries[sid] = e
        locks = [entries[s].lock for s in sorted(entries)]  # a global order: no deadlock between batches
        for lock in locks:
            await lock.acquire()
        try:
            plan: dict[int, list[int]] = {}
            for i, (sid, _) in enumerate(items):
                e = entries.get(sid)
                if e is None:
                    continue
                if self.table.get(sid) is not e:  # closed or expired while we waited
                    results[i] = ApiError(404, "UnknownSession", _unknown(sid)).result()
                    continue
                e.last_used = time.monotonic()
                plan.setdefault(e.worker, []).append(i)
            groups = list(plan.items())
            done = await asyncio.gather(*(self._run(k, [(op, items[i][0], *items[i][1]) for i in idx], codec)
                                          for k, idx in groups),
                                        return_exceptions=True)
            now = time.monotonic()
            for (k, idx), out in zip(groups, done):
                for j, i in enumerate(idx):
                    sid = items[i][0]
                    if isinstance(out, BaseException):
                        err = out if isinstance(out, ApiError) else ApiError(503, "Busy", str(out))
                        results[i] = err.result()
                        continue
                    res = out[j]
                    results[i] = res
                    entries[sid].last_used = now
                    if op == "close" and res[0] == "ok":
                        if self.table.pop(sid, None) is not None:
                            self.metrics.counts["sessions_closed"] += 1
                    self._account(op, sid, res)
        finally:
            for lock in locks:
                lock.release()
        return results

    def extra_metrics(self) -> dict[str, Any]:
        """The ``service/*`` gauges /metrics adds to the request counts."""
        out: dict[str, Any] = {
            "service/sessions_active": len(self.table),
            "service/max_sessions": self.cfg.max_sessions,
            "service/workers": self.cfg.workers,
            "service/rss_bytes": rss_bytes(os.getpid()),
        }
        pids = self.executor.pids()
        if pids:
            out["service/worker_rss_bytes"] = [rss_bytes(p) for p in pids]
        out.update(self.connections.snapshot())
        return out


def _unknown(sid: str) -> str:
    return (f"unknown session '{sid[:80]}': it expired (idle TTL), was closed, or the server restarted. "
            "Create a new session (RemoteEnv does this and replays the episode by itself).")
