"""Connection guards of ``vagent serve-env``: header and body read timeouts, and a cap on the
connections one client address may hold open.

uvicorn has a keep-alive timeout between requests but none while a request's headers or body
arrive, so a client that opens a connection and sends half a request holds it forever (before
any token check). :func:`guarded_protocol` returns uvicorn's HTTP protocol class (httptools when
installed, else h11) extended with:

- a header timeout: from the connection's first byte (or the end of the previous response) to
  the end of the request's headers, at most ``header_timeout`` seconds;
- a read timeout: from the end of the headers to the end of the body, at most ``read_timeout``;
- at most ``max_per_client`` open connections per client IP address; one more is answered 503
  and closed at once.

A request that runs out of time is answered ``408`` (JSON ErrorBody, ``Connection: close``) and
its connection closed. The counters are in :class:`ConnectionLimits` (``/metrics``:
``service/connections_open``, ``service/connection_timeouts``, ``service/connections_refused``).
Once the request has arrived, the env's own time is not limited here (clients set their timeout).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ConnectionLimits:
    """The limits (server flags) and the live counts they are checked against."""

    #: seconds from a request's first byte to the end of its headers
    header_timeout: float = 10.0
    #: seconds from the end of the headers to the end of the body
    read_timeout: float = 30.0
    #: open connections one client address may hold
    max_per_client: int = 128
    open: dict[str, int] = field(default_factory=dict)
    timeouts: int = 0
    refused: int = 0

    def snapshot(self) -> dict[str, Any]:
        return {"service/connections_open": sum(self.open.values()), "service/connection_timeouts": self.timeouts,
                "service/connections_refused": self.refused}


def _raw_response(status: int, reason: str, kind: str, detail: str) -> bytes:
    body = json.dumps({"error": kind, "detail": detail, "session_closed": False}).encode()
    head = (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\nconnection: close\r\n"
            f"content-length: {len(body)}\r\n\r\n").encode()
    return head + body


class _GuardMixin:
    """Shared by the httptools and h11 variants: counting, timers, refusing."""

    limits: ConnectionLimits
    transport: asyncio.Transport
    loop: asyncio.AbstractEventLoop
    client: tuple[str, int] | None

    # connection_made/_lost run before uvicorn's protocol (the class after this mixin in the MRO)
    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self._vg_setup()

    def connection_lost(self, exc: Exception | None) -> None:
        self._vg_release()
        super().connection_lost(exc)  # type: ignore[misc]

    def _vg_setup(self) -> bool:
        """Count the connection; False (after answering 503 and closing) when over the cap."""
        self._vg_timer: asyncio.TimerHandle | None = None
        self._vg_host = self.client[0] if self.client else "-"
        lim = self.limits
        n = lim.open.get(self._vg_host, 0)
        if n >= lim.max_per_client:
            lim.refused += 1
            self._vg_counted = False
            self.transport.write(_raw_response(
                503, "Service Unavailable", "Busy", f"this client address holds {n} open connections, the server's "
                f"limit (--max-connections-per-client {lim.max_per_client}); reuse connections (keep-alive) or "
                "close idle ones."))
            self.transport.close()
            return False
        lim.open[self._vg_host] = n + 1
        self._vg_counted = True
        self._vg_arm(lim.header_timeout, "headers")
        return True

    def _vg_release(self) -> None:
        self._vg_cancel()
        if getattr(self, "_vg_counted", False):
            self._vg_counted = False
            left = self.limits.open.get(self._vg_host, 1) - 1
            if left > 0:
                self.limits.open[self._vg_host] = left
            else:
                self.limits.open.pop(self._vg_host, None)

    def _vg_arm(self, seconds: float, phase: str) -> None:
        self._vg_cancel()
        self._vg_timer = self.loop.call_later(seconds, self._vg_expired, phase, seconds)

    def _vg_cancel(self) -> None:
        timer = getattr(self, "_vg_timer", None)
        if timer is not None:
            timer.cancel()
            self._vg_timer = None

    def _vg_expired(self, phase: str, seconds: float) -> None:
        self._vg_timer = None
        if self.transport.is_closing():
            return
        self.limits.timeouts += 1
        flag = "--header-timeout" if phase == "headers" else "--read-timeout"
        self.transport.write(_raw_response(
            408, "Request Timeout", "RequestTimeout", f"the request's {phase} did not arrive within {seconds:g} s "
            f"(the server's {flag}); send whole requests promptly."))
        self.transport.close()


def guarded_protocol(limits: ConnectionLimits) -> type:
    """uvicorn's HTTP protocol class (httptools if installed, else h11) with the guards above."""
    if importlib.util.find_spec("httptools") is not None:
        return _httptools_guarded(limits)
    return _h11_guarded(limits)


def _httptools_guarded(limits: ConnectionLimits) -> type:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class GuardedHttpTools(_GuardMixin, HttpToolsProtocol):
        def on_message_begin(self) -> None:
            super().on_message_begin()
            if self._vg_timer is None:  # a new request on a kept-alive connection
                self._vg_arm(self.limits.header_timeout, "headers")

        def on_headers_complete(self) -> None:
            self._vg_arm(self.limits.read_timeout, "body")
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            self._vg_cancel()
            super().on_message_complete()

    GuardedHttpTools.limits = limits
    return GuardedHttpTools


def _h11_guarded(limits: ConnectionLimits) -> type:
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class GuardedH11(_GuardMixin, H11Protocol):
        def data_received(self, data: bytes) -> None:
            if self._vg_timer is None and self.conn.their_state in (h11.IDLE, h11.DONE):
                self._vg_arm(self.limits.header_timeout, "headers")
            super().data_received(data)
            state = self.conn.their_state
            if state is h11.SEND_BODY and getattr(self, "_vg_phase_body", None) is not self.conn:
                self._vg_phase_body = self.conn
                self._vg_arm(self.limits.read_timeout, "body")
            elif state in (h11.DONE, h11.MUST_CLOSE, h11.CLOSED):
                self._vg_cancel()
                self._vg_phase_body = None

    GuardedH11.limits = limits
    return GuardedH11


__all__ = ["ConnectionLimits", "guarded_protocol"]
