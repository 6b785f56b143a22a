"""The env server: FastAPI routes over :class:`~vagent.service.host.SessionHost`.

Run it with ``vagent serve-env`` or ``python -m vagent.service.server`` (same flags).

Design (docs/service.md has the full story):

- One front process parses HTTP on an asyncio loop (uvicorn). Env work never runs on the loop:
  with ``--workers 1`` it runs in the front's thread pool; with ``--workers W`` (W >= 2) in W
  worker processes, each owning the sessions it created (sessions are routed by id; the front
  keeps ``session id -> worker``). Calls on one session serialize on a per-session lock.
- A worker process that dies loses its sessions: they answer 404 afterwards, the in-flight call
  answers 503, the worker is restarted, and :class:`~vagent.service.client.RemoteEnv` recreates
  and replays the lost episodes by itself.
- Sessions expire after ``--session-ttl`` seconds idle (a background sweeper); at
  ``--max-sessions`` a create answers 503 with ``Retry-After``; bodies over ``--max-body-bytes``
  answer 413; an unknown session 404; a malformed request 422 with the reason; an env exception
  500 with the error text (``reset``/``step`` then close the session; it is never a reward).
- A bearer token (``--token`` or ``VAGENT_SERVICE_TOKEN``) guards every route but ``/health``;
  it is compared in constant time and required whenever the host is not loopback.
- What clients may configure: env configs pass the env's bounds (vagent/envs/limits.py; 422
  naming the bound); server-only fields (files, modules, simulator processes, sandbox limits)
  come only from the operator's ``--env-config ENV.FIELD=VALUE`` (vagent/service/host.py).
- Slow clients: header and body read timeouts and a cap on connections per client address
  (vagent/service/connections.py) drop half-open requests with 408.
"""

from __future__ import annotations

import asyncio
import errno
import hmac
import importlib.util
import itertools
import os
import re
import secrets
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

from fastapi import FastAPI, Header, Path, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from vagent import __version__
from vagent.service import protocol as P
from vagent.service.config import ServerConfig, StartupError, validate_config
from vagent.service.connections import ConnectionLimits, guarded_protocol
from vagent.service.host import SessionHost, import_plugins
from vagent.service.metrics import Metrics, rss_bytes
from vagent.service.workers import LocalExecutor, ProcessExecutor, WorkerLost


# ----------------------------------------------------------------------------- the Host check

#: the names a tokenless (loopback) server answers to: a web page that points its own domain name at
#: 127.0.0.1 (DNS rebinding) sends its own name as Host and is refused, as vagent view does
LOCAL_HOSTS = ("127.0.0.1", "localhost", "[::1]", "::1")


def host_name(header: bytes | None) -> str | None:
    """The name of a ``Host`` header without its port, lower case (``[::1]:8765`` -> ``[::1]``,
    ``LocalHost.:8765`` -> ``localhost``); None without one."""
    if header is None:
        return None
    h = header.decode("latin-1").strip().lower()
    if h.startswith("["):
        h = h[:h.find("]") + 1] if "]" in h else h
    elif h.count(":") == 1:
        h = h.rsplit(":", 1)[0]
    return h.rstrip(".")


def host_refusal(header: bytes | None, bound: str) -> str:
    shown = header.decode("latin-1")[:100] if header is not None else None
    return (f"Host {shown!r} is not a name of this server (127.0.0.1, localhost, [::1], {bound}): a server without "
            "a token answers only requests addressed to loopback, so that a web page cannot drive it through DNS "
            "rebinding. Connect to http://127.0.0.1:PORT, or start the server with --token to serve other names.")


# ----------------------------------------------------------------------------- the front


@dataclass
class _Entry:
    worker: int
    env: str
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    last_used: float = field(default_factory=time.monotonic)


class ApiError(Exception):
    def __init__(self, status: int, kind: str, detail: str, headers: dict | None = None) -> None:
        super().__init__(detail)
        self.status, self.kind, self.detail, self.headers = status, kind, detail, headers or {}


def error_response(status: int, kind: str, detail: str, closed: bool = False, headers: dict | None = None) -> JSONResponse:
    body = {"error": kind, "detail": detail, "session_closed": closed}
    return JSONResponse(body, status_code=status, headers=headers)


def _frame_images(x: Any, parts: list[bytes]) -> Any:
    """Move PNG bytes out of observation dicts into ``parts``, leaving their indices."""
    if isinstance(x, dict):
        out = {}
        for k, v in x.items():
            if k == "images" and isinstance(v, list) and all(isinstance(b, bytes) for b in v):
                out[k] = list(range(len(parts), len(parts) + len(v)))
                parts.extend(v)
            else:
                out[k] = _frame_images(v, parts)
        return out
    if isinstance(x, list):
        return [_frame_images(v, parts) for v in x]
    return x


def frames_response(header: dict) -> Response:
    parts: list[bytes] = []
    header = _frame_images(header, parts)
    return Response(P.encode_frames(header, parts), media_type=P.FRAMES_MEDIA_TYPE)


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
        self.token = cfg.token.encode() if cfg.token else None

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
                        results[i] = ("err", err.status, {"error": err.kind, "detail": err.detail, "session_closed": False})
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
                results[i] = ("err", 404, {"error": "UnknownSession", "detail": _unknown(sid), "session_closed": False})
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
                    results[i] = ("err", 404, {"error": "UnknownSession", "detail": _unknown(sid), "session_closed": False})
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
                        results[i] = ("err", err.status, {"error": err.kind, "detail": err.detail, "session_closed": False})
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

    def host_allowed(self, header: bytes | None) -> bool:
        """A server without a token (loopback only) answers requests addressed to a loopback name
        (127.0.0.1, localhost, [::1], or the address it listens on), any port; with a token, any."""
        return self.token is not None or host_name(header) in {*LOCAL_HOSTS, self.cfg.host.lower()}

    def check_token(self, header: bytes) -> bool:
        if self.token is None:
            return True
        scheme, _, value = header.partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(value.strip(), self.token)

    def extra_metrics(self) -> dict[str, Any]:
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


def _item(res: tuple) -> dict:
    if res[0] == "ok":
        return {"status": 200, "ok": res[1], "error": None}
    return {"status": res[1], "ok": None, "error": res[2]}


# ------------------------------------------------------------------------ ASGI middleware


class _TooLarge(Exception):
    pass


class Guard:
    """Pure ASGI middleware: bearer auth, the body-size limit, and request metrics."""

    def __init__(self, app: Any, front: Front) -> None:
        self.app, self.front = app, front

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        state: dict[str, Any] = {"status": 500, "started": False, "too_large": False}

        async def send_(msg: dict) -> None:
            if state["too_large"]:  # the app answered a body we cut off (FastAPI turns our error into a 400)
                if not state["started"]:
                    state["started"] = True
                    await _too_large(limit)(scope, receive, send_raw)
                return
            await send_raw(msg)

        async def send_raw(msg: dict) -> None:
            if msg["type"] == "http.response.start":
                state["status"], state["started"] = msg["status"], True
            await send(msg)

        front, limit = self.front, self.front.cfg.max_body_bytes
        headers = dict(scope["headers"])
        try:
            if not front.host_allowed(headers.get(b"host")):
                await error_response(403, "Forbidden", host_refusal(headers.get(b"host"), front.cfg.host))(
                    scope, receive, send_)
                return
            if scope["path"] != "/health" and not front.check_token(headers.get(b"authorization", b"")):
                resp = error_response(401, "Unauthorized", "missing or wrong bearer token: send the header "
                                      "'Authorization: Bearer <token>' with the token the server was started with.",
                                      headers={"WWW-Authenticate": "Bearer"})
                await resp(scope, receive, send_)
                return
            length = headers.get(b"content-length")
            if length is not None and (not length.isdigit() or int(length) > limit):
                await _too_large(limit)(scope, receive, send_)
                return
            seen = 0

            async def receive_() -> dict:
                nonlocal seen
                msg = await receive()
                if msg["type"] == "http.request":
                    seen += len(msg.get("body", b""))
                    if seen > limit:
                        state["too_large"] = True
                        raise _TooLarge
                return msg

            try:
                if scope["method"] == "POST" and await self._fast_step(scope, receive_, send_, headers):
                    return
                await self.app(scope, receive_, send_)
            except _TooLarge:
                if not state["started"]:
                    state["started"] = True
                    await _too_large(limit)(scope, receive, send_raw)
        finally:
            # bounded keys: unmatched paths and unusual methods share one bucket each
            route = getattr(scope.get("route"), "path", None)
            method = scope["method"] if scope["method"] in ("GET", "POST", "DELETE") else "OTHER"
            key = f"{method} {route}" if route and state["status"] != 405 else f"{method} <unmatched>"
            front.metrics.record(key, state["status"], time.perf_counter() - t0)


class _Route:
    def __init__(self, path: str) -> None:
        self.path = path


_STEP_PATH = re.compile(rf"^{P.API_PREFIX}/sessions/([^/]{{1,{P.MAX_NAME}}})/step$")
_BATCH_STEP_PATH = f"{P.API_PREFIX}/batch/step"


async def _fast_step(self: "Guard", scope: dict, receive: Callable, send: Callable, headers: dict) -> bool:
    """The step routes without FastAPI's per-request machinery (they carry every env step, so its
    ~0.2-0.5 ms a request showed in steps/s): read the body, validate it with the same pydantic
    models, answer the same frame. Anything unusual (a body that does not validate, an unknown
    codec) returns False with the body replayed to the FastAPI route, which answers as always."""
    path = scope["path"]
    m = _STEP_PATH.match(path)
    if m is None and path != _BATCH_STEP_PATH:
        return False
    codec = headers.get(P.IMAGES_HEADER.lower().encode(), b"png").decode("latin-1")
    chunks, more = [], True
    while more:
        msg = await receive()
        if msg["type"] != "http.request":
            return True  # the client went away
        chunks.append(msg.get("body", b""))
        more = msg.get("more_body", False)
    body = b"".join(chunks)
    try:
        if codec not in P.IMAGE_CODECS:
            raise ValueError(codec)
        req = (P.StepRequest if m else P.BatchStepRequest).model_validate_json(body)
    except ValueError:  # pydantic's ValidationError too: FastAPI words the 422
        sent = False

        async def replay() -> dict:
            nonlocal sent
            if sent:
                return await receive()
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)
        return True
    front = self.front
    try:
        if m:
            scope["route"] = _Route(f"{P.API_PREFIX}/sessions/{{session_id}}/step")
            res = await front.session_op(m.group(1), "step", req.response, req.index, codec=codec)
            response = _respond(res, framed=True)
        else:
            scope["route"] = _Route(_BATCH_STEP_PATH)
            results = await front.batch_op("step", [(it.session_id, (it.response, it.index)) for it in req.items], codec)
            response = frames_response({"results": [_item(r) for r in results]})
    except ApiError as exc:
        response = error_response(exc.status, exc.kind, exc.detail, headers=exc.headers)
    await response(scope, receive, send)
    return True


Guard._fast_step = _fast_step  # type: ignore[attr-defined]


def _too_large(limit: int) -> JSONResponse:
    return error_response(413, "PayloadTooLarge", f"request body over the server's limit of {limit} bytes; "
                          "send smaller batches or start the server with a larger --max-body-bytes.")


# ------------------------------------------------------------------------------- the app

_FRAMED = {200: {"description": "a frame: JSON header + PNG parts (see vagent.service.protocol)",
                 "content": {P.FRAMES_MEDIA_TYPE: {"schema": {"type": "string", "format": "binary"}}}}}
_ERRORS = {s: {"model": P.ErrorBody} for s in (401, 404, 409, 413, 422, 500, 503)}
SID = Path(min_length=1, max_length=P.MAX_NAME, description="the session id returned by create")
CODEC = Header("png", alias=P.IMAGES_HEADER, pattern="^(png|raw|zlib)$",
               description="image codec of the frame's parts: png (default), raw pixels, or zlib-compressed pixels")


def _respond(res: tuple, framed: bool) -> Response:
    if res[0] == "ok":
        return frames_response(res[1]) if framed else JSONResponse(res[1])
    status, body = res[1], res[2]
    headers = {"Retry-After": "1"} if status == 503 else None
    return JSONResponse(body, status_code=status, headers=headers)


def create_app(cfg: ServerConfig) -> FastAPI:
    """The FastAPI app (also usable in-process with any ASGI server)."""
    front = Front(cfg)

    async def lifespan(app: FastAPI):  # type: ignore[no-untyped-def]
        await front.start()
        yield
        await front.stop()

    app = FastAPI(title="vagent env service", version=__version__, lifespan=lifespan,
                  docs_url=None, redoc_url=None, responses=_ERRORS)
    app.state.front = front
    _add_error_handlers(app)
    _add_session_routes(app, front)
    _add_batch_routes(app, front)
    _add_service_routes(app, front, cfg)
    return Guard(app, front)  # type: ignore[return-value]


def _add_error_handlers(app: FastAPI) -> None:
    """Every error becomes an ErrorBody; FastAPI's 400 for an unparsable body becomes a 422."""

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status, exc.kind, exc.detail, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        parts = []
        for e in exc.errors()[:5]:
            loc = ".".join(str(x) for x in e.get("loc", ()))
            parts.append(f"{loc}: {e.get('msg')}")
        return error_response(422, "ValidationError", "invalid request: " + "; ".join(parts)
                              + ". See /openapi.json for the request schemas.")

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 400:  # FastAPI's "error parsing the body" (e.g. not UTF-8): a bad request, 422
            return error_response(422, "ValidationError", f"invalid request body ({exc.detail}): send UTF-8 JSON "
                                  "matching the route's schema (see /openapi.json).")
        kind = {404: "NotFound", 405: "MethodNotAllowed"}.get(exc.status_code, "HTTPError")
        detail = f"{exc.detail}: {request.method} {request.url.path[:200]}"
        return error_response(exc.status_code, kind, detail, headers=getattr(exc, "headers", None))



def _add_session_routes(app: FastAPI, front: Front) -> None:
    """Create, reset, step, system_prompt, state, optimal_actions and close of one session."""

    @app.post(f"{P.API_PREFIX}/sessions", response_class=Response, responses=_FRAMED,
              summary="create a session (optionally reset it, and replay replies, in the same round trip)")
    async def create(req: P.CreateRequest, codec: str = CODEC) -> Response:
        [res] = await front.create_many([req], codec)
        return _respond(res, framed=True)

    @app.post(f"{P.API_PREFIX}/sessions/{{session_id}}/reset", response_class=Response, responses=_FRAMED)
    async def reset(req: P.ResetRequest, session_id: str = SID, codec: str = CODEC) -> Response:
        return _respond(await front.session_op(session_id, "reset", req.seed, codec=codec), framed=True)

    @app.post(f"{P.API_PREFIX}/sessions/{{session_id}}/step", response_class=Response, responses=_FRAMED)
    async def step(req: P.StepRequest, session_id: str = SID, codec: str = CODEC) -> Response:
        return _respond(await front.session_op(session_id, "step", req.response, req.index, codec=codec), framed=True)

    @app.get(f"{P.API_PREFIX}/sessions/{{session_id}}/system_prompt", response_model=P.SystemPromptOut)
    async def system_prompt(session_id: str = SID) -> Response:
        return _respond(await front.session_op(session_id, "system_prompt"), framed=False)

    @app.get(f"{P.API_PREFIX}/sessions/{{session_id}}/state", response_model=P.StateOut)
    async def state(session_id: str = SID) -> Response:
        return _respond(await front.session_op(session_id, "state"), framed=False)

    @app.get(f"{P.API_PREFIX}/sessions/{{session_id}}/optimal_actions", response_model=P.OptimalActionsOut)
    async def optimal_actions(session_id: str = SID) -> Response:
        return _respond(await front.session_op(session_id, "optimal_actions"), framed=False)

    @app.delete(f"{P.API_PREFIX}/sessions/{{session_id}}", response_model=P.ClosedOut)
    async def close(session_id: str = SID) -> Response:
        return _respond(await front.session_op(session_id, "close"), framed=False)



def _add_batch_routes(app: FastAPI, front: Front) -> None:
    """Batch routes: per-item results ({status, ok, error}) in request order."""

    @app.post(f"{P.API_PREFIX}/batch/create", response_class=Response, responses=_FRAMED)
    async def batch_create(req: P.BatchCreateRequest, codec: str = CODEC) -> Response:
        results = await front.create_many(req.items, codec)
        return frames_response({"results": [_item(r) for r in results]})

    @app.post(f"{P.API_PREFIX}/batch/reset", response_class=Response, responses=_FRAMED)
    async def batch_reset(req: P.BatchResetRequest, codec: str = CODEC) -> Response:
        results = await front.batch_op("reset", [(it.session_id, (it.seed,)) for it in req.items], codec)
        return frames_response({"results": [_item(r) for r in results]})

    @app.post(f"{P.API_PREFIX}/batch/step", response_class=Response, responses=_FRAMED)
    async def batch_step(req: P.BatchStepRequest, codec: str = CODEC) -> Response:
        results = await front.batch_op("step", [(it.session_id, (it.response, it.index)) for it in req.items], codec)
        return frames_response({"results": [_item(r) for r in results]})

    @app.post(f"{P.API_PREFIX}/batch/close", response_model=P.BatchOut)
    async def batch_close(req: P.BatchCloseRequest) -> Response:
        results = await front.batch_op("close", [(sid, ()) for sid in req.session_ids])
        return JSONResponse({"results": [_item(r) for r in results]})



def _add_service_routes(app: FastAPI, front: Front, cfg: ServerConfig) -> None:
    """The served env names, /health (no token) and /metrics."""

    @app.get(f"{P.API_PREFIX}/envs", response_model=P.EnvsOut)
    async def envs() -> Response:
        from vagent.envs import list_envs

        return JSONResponse({"envs": list(cfg.envs) or list_envs()})

    @app.get(f"{P.API_PREFIX}/envs/{{name}}", response_model=P.EnvInfoOut)
    async def env_info(name: str = Path(min_length=1, max_length=P.MAX_NAME)) -> Response:
        from vagent.service.host import env_info as describe_env

        result = await asyncio.to_thread(describe_env, name, tuple(cfg.envs))  # a first use imports the env's module
        if result[0] == "ok":
            return JSONResponse(result[1])
        return JSONResponse(result[2], status_code=result[1])

    @app.get("/health", response_model=P.HealthOut)
    async def health() -> Response:
        return JSONResponse({"status": "ok", "version": __version__, "sessions": len(front.table),
                             "workers": cfg.workers, "worker_pids": front.executor.pids()})

    @app.get("/metrics")
    async def metrics() -> Response:
        return JSONResponse(front.metrics.snapshot(front.extra_metrics()))


def check_env_config(cfg: ServerConfig) -> None:
    """Every ``--env-config`` env exists (and is served) and makes an env with the operator's values
    (so a wrong path or field fails at start-up, not when a client first creates an env)."""
    from vagent.config import ConfigError
    from vagent.envs import env_class, make

    for name, values in cfg.env_config.items():
        try:
            env_class(name)
        except KeyError as exc:
            raise StartupError(f"--env-config {name}.*: {exc.args[0]}") from exc
        if cfg.envs and name not in cfg.envs:
            raise StartupError(f"--env-config {name}.*: env '{name}' is not served (--envs {','.join(cfg.envs)}).")
        try:
            make(name, **values).close()
        except ConfigError as exc:
            raise StartupError(f"--env-config {name}.*: {exc}") from exc


def serve(cfg: ServerConfig) -> None:
    """Validate ``cfg``, import plugin envs, check every served env exists, and run uvicorn."""
    import uvicorn

    if cfg.token is None and os.environ.get("VAGENT_SERVICE_TOKEN"):
        cfg.token = os.environ["VAGENT_SERVICE_TOKEN"]
    validate_config(cfg)
    from vagent.plugins import PluginImportError

    try:
        import_plugins(cfg.imports)
    except PluginImportError as exc:
        raise StartupError(f"--import: {exc}") from exc
    from vagent.envs import env_class, list_envs

    for name in cfg.envs:
        try:
            env_class(name)
        except KeyError as exc:
            raise StartupError(f"--envs: {exc.args[0]}") from exc
    check_env_config(cfg)
    sock = listen_socket(cfg.host, cfg.port)
    cfg.port = sock.getsockname()[1]  # --port 0: the port the kernel picked
    app = create_app(cfg)
    served = ", ".join(cfg.envs or list_envs())
    speed = [m for m in ("uvloop", "httptools") if importlib.util.find_spec(m) is not None]
    print(f"vagent serve-env: http://{cfg.host}:{cfg.port} envs=[{served}] workers={cfg.workers} "
          f"max_sessions={cfg.max_sessions} session_ttl={cfg.session_ttl}s max_body={cfg.max_body_bytes}B "
          f"auth={'bearer token' if cfg.token else 'off (loopback only)'} "
          f"fast-path={'+'.join(speed) or 'none (pip install uvloop httptools for faster HTTP; docs/service.md)'}", flush=True)
    front: Front = app.front  # type: ignore[attr-defined]
    config = uvicorn.Config(app, host=cfg.host, port=cfg.port, log_level=cfg.log_level, access_log=False,
                            timeout_keep_alive=cfg.keep_alive_timeout, lifespan="on",
                            http=guarded_protocol(front.connections))
    uvicorn.Server(config).run(sockets=[sock])  # what uvicorn.run does, on the socket bound above


def listen_socket(host: str, port: int) -> "socket.socket":
    """A listening TCP socket on ``host:port`` (as uvicorn binds it: SO_REUSEADDR, IPv6 for a host
    with a colon); port 0 takes a free port. A port that cannot be bound is one StartupError line."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        why = "address already in use" if exc.errno == errno.EADDRINUSE else (exc.strerror or str(exc))
        raise StartupError(f"cannot listen on {host}:{port}: {why}; pick another --port (or 0: any free port) "
                           "or stop the process that holds it.") from exc
    sock.set_inheritable(True)
    return sock


def main(argv: list[str] | None = None) -> int:
    import argparse

    from vagent.service.config import add_arguments, config_from_args

    parser = argparse.ArgumentParser(prog="python -m vagent.service.server", description="Serve vagent envs over HTTP.")
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        serve(config_from_args(args))
    except StartupError as exc:
        print(f"vagent serve-env: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
