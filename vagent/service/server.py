"""The env server: FastAPI routes over :class:`~vagent.service.host.SessionHost`.

Run it with ``vagent serve-env`` or ``python -m vagent.service.server`` (same flags). This module
holds the routes and start-up; the session table is :mod:`vagent.service.front`, the checks every
request passes first (Host, token, body size, metrics) :mod:`vagent.service.guard`.

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
import importlib.util
import os
import socket
import sys

from fastapi import FastAPI, Header, Path, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from vagent import __version__
from vagent.service import protocol as P
from vagent.service.config import ServerConfig, StartupError, validate_config
from vagent.service.connections import guarded_protocol
from vagent.service.front import Front
from vagent.service.guard import Guard
from vagent.service.host import import_plugins
from vagent.service.responses import ApiError, error_response, frames_response, item, respond


# ------------------------------------------------------------------------------- the app

_FRAMED = {200: {"description": "a frame: JSON header + PNG parts (see vagent.service.protocol)",
                 "content": {P.FRAMES_MEDIA_TYPE: {"schema": {"type": "string", "format": "binary"}}}}}
_ERRORS = {s: {"model": P.ErrorBody} for s in (401, 404, 409, 413, 422, 500, 503)}
SID = Path(min_length=1, max_length=P.MAX_NAME, description="the session id returned by create")
CODEC = Header("png", alias=P.IMAGES_HEADER, pattern="^(png|raw|zlib)$",
               description="image codec of the frame's parts: png (default), raw pixels, or zlib-compressed pixels")


def create_app(cfg: ServerConfig) -> FastAPI:
    """The FastAPI app (also usable in-process with any ASGI server)."""
    front = Front(cfg)

    async def lifespan(app: FastAPI):
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
    return Guard(app, front)


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
        return respond(res, framed=True)

    @app.post(f"{P.API_PREFIX}/sessions/{{session_id}}/reset", response_class=Response, responses=_FRAMED)
    async def reset(req: P.ResetRequest, session_id: str = SID, codec: str = CODEC) -> Response:
        return respond(await front.session_op(session_id, "reset", req.seed, codec=codec), framed=True)

    @app.post(f"{P.API_PREFIX}/sessions/{{session_id}}/step", response_class=Response, responses=_FRAMED)
    async def step(req: P.StepRequest, session_id: str = SID, codec: str = CODEC) -> Response:
        return respond(await front.session_op(session_id, "step", req.response, req.index, codec=codec), framed=True)

    # the operations without a body and with a JSON answer: (HTTP method, path after the session's, op, answer)
    for method, tail, op, answer in (("GET", "/system_prompt", "system_prompt", P.SystemPromptOut),
                                     ("GET", "/state", "state", P.StateOut),
                                     ("GET", "/optimal_actions", "optimal_actions", P.OptimalActionsOut),
                                     ("DELETE", "", "close", P.ClosedOut)):
        app.add_api_route(f"{P.API_PREFIX}/sessions/{{session_id}}{tail}", _session_json_op(front, op),
                          methods=[method], response_model=answer, name=op)


def _session_json_op(front: Front, op: str):
    """The endpoint of session operation ``op`` (a method of the env without arguments): its JSON answer."""

    async def endpoint(session_id: str = SID) -> Response:
        return respond(await front.session_op(session_id, op), framed=False)

    return endpoint



def _add_batch_routes(app: FastAPI, front: Front) -> None:
    """Batch routes: per-item results ({status, ok, error}) in request order."""

    @app.post(f"{P.API_PREFIX}/batch/create", response_class=Response, responses=_FRAMED)
    async def batch_create(req: P.BatchCreateRequest, codec: str = CODEC) -> Response:
        results = await front.create_many(req.items, codec)
        return frames_response({"results": [item(r) for r in results]})

    @app.post(f"{P.API_PREFIX}/batch/reset", response_class=Response, responses=_FRAMED)
    async def batch_reset(req: P.BatchResetRequest, codec: str = CODEC) -> Response:
        results = await front.batch_op("reset", [(it.session_id, (it.seed,)) for it in req.items], codec)
        return frames_response({"results": [item(r) for r in results]})

    @app.post(f"{P.API_PREFIX}/batch/step", response_class=Response, responses=_FRAMED)
    async def batch_step(req: P.BatchStepRequest, codec: str = CODEC) -> Response:
        results = await front.batch_op("step", [(it.session_id, (it.response, it.index)) for it in req.items], codec)
        return frames_response({"results": [item(r) for r in results]})

    @app.post(f"{P.API_PREFIX}/batch/close", response_model=P.BatchOut)
    async def batch_close(req: P.BatchCloseRequest) -> Response:
        results = await front.batch_op("close", [(sid, ()) for sid in req.session_ids])
        return JSONResponse({"results": [item(r) for r in results]})



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
    front: Front = app.front
    config = uvicorn.Config(app, host=cfg.host, port=cfg.port, log_level=cfg.log_level, access_log=False,
                            timeout_keep_alive=cfg.keep_alive_timeout, lifespan="on",
                            http=guarded_protocol(front.connections))
    uvicorn.Server(config).run(sockets=[sock])  # what uvicorn.run does, on the socket bound above


def listen_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (as uvicorn binds it: SO_REUSEADDR, IPv6 for a host
    with a colon); port 0 takes a free port. A port that cannot be bound is one StartupError line."""
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
    from vagent.omp import apply_wait_settings

    try:
        apply_wait_settings()  # before an env loads torch (vagent.omp); `vagent serve-env` made it already
    except ValueError as exc:
        print(f"vagent serve-env: error: {exc}", file=sys.stderr)
        return 2
    try:
        serve(config_from_args(args))
    except StartupError as exc:
        print(f"vagent serve-env: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
