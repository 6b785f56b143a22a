"""The env server's ASGI middleware: what every request passes before a route.

:class:`Guard` answers, in this order: a Host that is not a loopback name on a tokenless server
403 (DNS rebinding); a missing or wrong bearer token 401 (``/health`` excepted); a body over
``--max-body-bytes`` 413; it records each request's route, status and time in the metrics; and
it serves the two step routes itself (:meth:`Guard._fast_step`), falling back to the FastAPI
route for anything unusual.
"""

from __future__ import annotations

import hmac
import re
import time
from typing import Any, Callable

from fastapi.responses import JSONResponse

from vagent.authority import host_name
from vagent.service import protocol as P
from vagent.service.front import Front
from vagent.service.responses import ApiError, error_response, frames_response, item, respond


#: the names a tokenless (loopback) server answers to: a web page that points its own domain name at
#: 127.0.0.1 (DNS rebinding) sends its own name as Host and is refused, as vagent view does
LOCAL_HOSTS = ("127.0.0.1", "localhost", "[::1]")


def host_refusal(header: bytes | None, bound: str) -> str:
    """The 403's detail for a Host that is not a loopback name (``bound``: the server's --host)."""
    shown = header.decode("latin-1")[:100] if header is not None else None
    return (f"Host {shown!r} is not a name of this server (127.0.0.1, localhost, [::1], {bound}): a server without "
            "a token answers only requests addressed to loopback, so that a web page cannot drive it through DNS "
            "rebinding. Connect to http://127.0.0.1:PORT, or start the server with --token to serve other names.")


class _TooLarge(Exception):
    pass


class Guard:
    """Pure ASGI middleware: the Host check, bearer auth, the body-size limit, request metrics, and the
    step fast path."""

    def __init__(self, app: Any, front: Front) -> None:
        self.app, self.front = app, front
        self.token = front.cfg.token.encode() if front.cfg.token else None
        bound = front.cfg.host  # the address it listens on, as a Host names it (an IPv6 one in brackets)
        as_host = (host_name(bound.encode("latin-1", "replace")), host_name(f"[{bound}]".encode("latin-1", "replace")))
        self.local_names = {*LOCAL_HOSTS, *(n for n in as_host if n is not None)}

    def host_allowed(self, header: bytes | None) -> bool:
        """A server without a token (loopback only) answers requests addressed to a loopback name
        (127.0.0.1, localhost, [::1], or the address it listens on), any port; with a token, any."""
        if self.token is not None:
            return True
        name = host_name(header)
        return name is not None and name in self.local_names

    def check_token(self, header: bytes) -> bool:
        """``Authorization: Bearer <token>`` with the server's token (compared in constant time); any
        without a token."""
        if self.token is None:
            return True
        scheme, _, value = header.partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(value.strip(), self.token)

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
            if not self.host_allowed(headers.get(b"host")):
                await error_response(403, "Forbidden", host_refusal(headers.get(b"host"), front.cfg.host))(
                    scope, receive, send_)
                return
            if scope["path"] != "/health" and not self.check_token(headers.get(b"authorization", b"")):
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

    async def _fast_step(self, scope: dict, receive: Callable, send: Callable, headers: dict) -> bool:
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
                response = respond(res, framed=True)
            else:
                scope["route"] = _Route(_BATCH_STEP_PATH)
                results = await front.batch_op("step", [(it.session_id, (it.response, it.index)) for it in req.items], codec)
                response = frames_response({"results": [item(r) for r in results]})
        except ApiError as exc:
            response = error_response(exc.status, exc.kind, exc.detail, headers=exc.headers)
        await response(scope, receive, send)
        return True


class _Route:
    def __init__(self, path: str) -> None:
        self.path = path


_STEP_PATH = re.compile(rf"^{P.API_PREFIX}/sessions/([^/]{{1,{P.MAX_NAME}}})/step$")
_BATCH_STEP_PATH = f"{P.API_PREFIX}/batch/step"


def _too_large(limit: int) -> JSONResponse:
    return error_response(413, "PayloadTooLarge", f"request body over the server's limit of {limit} bytes; "
                          "send smaller batches or start the server with a larger --max-body-bytes.")
