"""The env server's answers: :class:`ApiError`, error bodies, frames, and a host result as a response.

Shared by the routes (:mod:`vagent.service.server`), the session table (:mod:`vagent.service.front`)
and the step fast path of the middleware (:mod:`vagent.service.guard`), so that each answers a
request the same way.
"""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse, Response

from vagent.service import protocol as P


class ApiError(Exception):
    """A request the front refuses: the HTTP ``status``, the error ``kind`` and ``detail`` of its
    :class:`~vagent.service.protocol.ErrorBody`, and extra response ``headers`` (``Retry-After``)."""

    def __init__(self, status: int, kind: str, detail: str, headers: dict | None = None) -> None:
        super().__init__(detail)
        self.status, self.kind, self.detail, self.headers = status, kind, detail, headers or {}

    def result(self) -> tuple:
        """The error as one item's result of a batch (``("err", status, body)``)."""
        return ("err", self.status, {"error": self.kind, "detail": self.detail, "session_closed": False})


def error_response(status: int, kind: str, detail: str, closed: bool = False, headers: dict | None = None) -> JSONResponse:
    """An :class:`~vagent.service.protocol.ErrorBody` answer."""
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
    """A frame: ``header`` as JSON with its observations' PNG bytes moved into the frame's parts."""
    parts: list[bytes] = []
    header = _frame_images(header, parts)
    return Response(P.encode_frames(header, parts), media_type=P.FRAMES_MEDIA_TYPE)



def respond(res: tuple, framed: bool) -> Response:
    """The answer to a host result: ``("ok", body)`` as a frame (``framed``) or JSON, ``("err", status, body)``
    as that status (503 with ``Retry-After``)."""
    if res[0] == "ok":
        return frames_response(res[1]) if framed else JSONResponse(res[1])
    status, body = res[1], res[2]
    headers = {"Retry-After": "1"} if status == 503 else None
    return JSONResponse(body, status_code=status, headers=headers)


def item(res: tuple) -> dict:
    """One batch item's result record: ``{status, ok, error}``."""
    if res[0] == "ok":
        return {"status": 200, "ok": res[1], "error": None}
    return {"status": res[1], "ok": None, "error": res[2]}

