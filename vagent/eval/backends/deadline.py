"""A total deadline per HTTP request, for the API backends' SDK clients (:func:`deadline_http_client`).

httpx's timeouts bound each socket operation: a read that receives one byte in time restarts the
clock, so a server that drips its answer keeps a request alive for as long as it drips. The
client here bounds the request as a whole: its transport notes the deadline (now + total_s) in
a thread-local at the start of each request, and every connect, read and write of its
connections waits at most until that deadline, then fails as httpx's own timeouts do
(ConnectTimeout / ReadTimeout / WriteTimeout, which the SDKs report as timeouts). The SDKs here
are synchronous: a request and the reading of its body run in the caller's thread. The SDKs use
httpx or its fork httpx2 (with httpcore / httpcore2); the same code serves both.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any, Iterable

if TYPE_CHECKING:
    import ssl
    from types import ModuleType

    import httpcore
    import httpx
    from httpcore._backends.base import SOCKET_OPTION

_deadline = threading.local()


def _time_left(timeout: float | None, exc: type[Exception]) -> float | None:
    """``timeout`` cut to the time left before this thread's request deadline; ``exc`` once it passed."""
    end = getattr(_deadline, "end", None)
    if end is None:
        return timeout
    left = end - time.monotonic()
    if left <= 0:
        raise exc(f"the request's total deadline of {_deadline.total_s:g} s (timeout_s) passed")
    return left if timeout is None else min(timeout, left)


class _DeadlineStream:
    """A connection (httpcore's NetworkStream) whose every read and write ends by the request's deadline."""

    def __init__(self, stream: httpcore.NetworkStream, core: ModuleType):
        self._stream, self._core = stream, core

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._stream.read(max_bytes, _time_left(timeout, self._core.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._stream.write(buffer, _time_left(timeout, self._core.WriteTimeout))

    def close(self) -> None:
        self._stream.close()

    def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None, timeout: float | None = None) -> Any:
        tls = self._stream.start_tls(ssl_context, server_hostname, _time_left(timeout, self._core.ConnectTimeout))
        return _DeadlineStream(tls, self._core)

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


class _DeadlineBackend:
    """httpcore's socket backend (NetworkBackend) with connections that end by the request's deadline."""

    def __init__(self, backend: httpcore.NetworkBackend, core: ModuleType):
        self._backend, self._core = backend, core

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                    socket_options: Iterable[SOCKET_OPTION] | None = None) -> _DeadlineStream:
        timeout = _time_left(timeout, self._core.ConnectTimeout)
        return _DeadlineStream(self._backend.connect_tcp(host, port, timeout, local_address, socket_options),
                               self._core)

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options: Iterable[SOCKET_OPTION] | None = None) -> _DeadlineStream:
        timeout = _time_left(timeout, self._core.ConnectTimeout)
        return _DeadlineStream(self._backend.connect_unix_socket(path, timeout, socket_options), self._core)

    def sleep(self, seconds: float) -> None:
        self._backend.sleep(seconds)


class DeadlineTransport:
    """httpx's (or httpx2's) HTTP transport with a total deadline of ``total_s`` per request (see above).

    package: "httpx" or "httpx2", the package of the client it goes into."""

    def __init__(self, total_s: float, package: str = "httpx"):
        import importlib

        self.total_s = float(total_s)
        http, core = importlib.import_module(package), importlib.import_module(package.replace("httpx", "httpcore"))
        self._inner = http.HTTPTransport()
        pool = getattr(self._inner, "_pool", None)
        if not isinstance(getattr(pool, "_network_backend", None), core.NetworkBackend):
            raise RuntimeError(f"{package} {http.__version__}: its transport has no connection pool with a network "
                               "backend to bound; install the versions of constraints.txt")
        pool._network_backend = _DeadlineBackend(pool._network_backend, core)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        _deadline.end, _deadline.total_s = time.monotonic() + self.total_s, self.total_s
        return self._inner.handle_request(request)

    def close(self) -> None:
        self._inner.close()

    def __enter__(self) -> "DeadlineTransport":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def http_package(sdk_client_class: type) -> str:
    """"httpx2" or "httpx": the package of an SDK's default HTTP client class (its ``http_client``
    must be a client of the same package)."""
    for cls in sdk_client_class.__mro__:
        root = cls.__module__.partition(".")[0]
        if root in ("httpx", "httpx2"):
            return root
    return "httpx"


def deadline_http_client(total_s: float, package: str = "httpx") -> Any:
    """An ``httpx.Client`` (``package="httpx2"``: an ``httpx2.Client``) whose every request (connect,
    send, headers, the whole body) ends within ``total_s`` seconds, for an SDK's ``http_client``."""
    import importlib

    http = importlib.import_module(package)
    return http.Client(transport=DeadlineTransport(total_s, package), timeout=total_s, follow_redirects=True)
