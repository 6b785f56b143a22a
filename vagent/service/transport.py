"""The client's wire layer: :class:`Transport` (one keep-alive HTTP client over one or more
server URLs, with retries and failover), the service's exceptions, the client counters
(:func:`client_metrics`), and the decoding of answers into env results.

:class:`~vagent.service.client.RemoteEnv` and :mod:`vagent.service.batch` build on it; the names
are re-exported by :mod:`vagent.service.client`.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from collections import Counter
from typing import Any, Sequence

from vagent.config import ConfigError
from vagent.envs.base import EnvError, EpisodeOverError, Observation, StepResult
from vagent.service import protocol as P
from vagent.service.httpclient import HttpClient, HttpResponse, TransportError


class ServiceError(RuntimeError):
    """The service answered with an error that is not an env error (auth, 413, 422, ...)."""

    def __init__(self, status: int, kind: str, detail: str) -> None:
        super().__init__(f"env service answered {status} {kind}: {detail}")
        self.status, self.kind, self.detail = status, kind, detail


class ServiceUnavailable(ServiceError):
    """No server answered within ``retry_timeout`` (connection errors or 503 all along)."""


class EnvConfigMismatch(ServiceError):
    """No server would take the session under the env config it started with (409
    ``ConfigMismatch`` from each one tried): the servers' operator configs differ, so restoring the
    episode elsewhere would continue it under another config. ``config`` is the last refusing
    server's resolved config."""

    def __init__(self, status: int, kind: str, detail: str, config: dict | None = None) -> None:
        super().__init__(status, kind, detail)
        self.config = config


class RemoteEnvException(EnvError):
    """The remote env raised (HTTP 500); ``detail`` holds the remote error text and location."""

    def __init__(self, detail: str, session_closed: bool) -> None:
        super().__init__(f"remote env error: {detail}" + (" (the server closed the session)" if session_closed else ""))
        self.detail, self.session_closed = detail, session_closed


class _SessionLost(Exception):
    """Internal: the session's server is unreachable or no longer knows it: restore it."""


_METRICS: Counter = Counter({k: 0 for k in ("replays", "replayed_steps", "retries", "failovers", "requests")})
_METRICS_LOCK = threading.Lock()


def _count(key: str, n: int = 1) -> None:
    with _METRICS_LOCK:
        _METRICS[key] += n


def client_metrics() -> dict[str, int]:
    """Counters of this process's clients: ``service/replays`` (sessions restored by replay),
    ``service/replayed_steps``, ``service/retries``, ``service/failovers``, ``service/requests``."""
    with _METRICS_LOCK:
        return {f"service/{k}": v for k, v in sorted(_METRICS.items())}


#: error kinds a local env raises as these exceptions, with the detail as their message
_LOCAL_ERRORS: dict[str, type[Exception]] = {
    "UnknownSession": _SessionLost, "EpisodeOverError": EpisodeOverError, "EnvError": EnvError,
    "ConfigError": ConfigError, "UnknownEnv": KeyError, "NotSupported": NotImplementedError,
}


def _raise_error(status: int, body: Any) -> None:
    """Raise the exception a local env would have raised for this error (see protocol.ERROR_STATUS)."""
    if not isinstance(body, dict):
        raise ServiceError(status, "HTTPError", str(body)[:500])
    kind, detail = str(body.get("error", "HTTPError")), str(body.get("detail", ""))
    local = _LOCAL_ERRORS.get(kind)
    if local is not None:
        raise local(detail)
    if kind == "EnvException":
        raise RemoteEnvException(detail, bool(body.get("session_closed")))
    if kind == "ConfigMismatch":
        raise EnvConfigMismatch(status, kind, detail, body.get("config") if isinstance(body.get("config"), dict) else None)
    raise ServiceError(status, kind, detail)


def _body(r: HttpResponse) -> Any:
    try:
        return r.json()
    except ValueError:
        return r.text


class Transport:
    """One keep-alive HTTP client over one or more server URLs, with retries and failover
    (:class:`~vagent.service.httpclient.HttpClient`, on the standard library's ``http.client``).

    ``timeout``: seconds for one HTTP request; ``retry_timeout``: seconds one logical call may
    spend retrying; ``backoff``/``max_backoff``: the jittered exponential backoff in seconds;
    ``images``: the image codec asked of the server (``png``, ``raw``, ``zlib``; ``auto``: raw
    pixels when every URL is loopback, where bytes are free, else zlib; all lossless).
    ``token``: the servers' bearer token; None reads the environment variable
    ``VAGENT_SERVICE_TOKEN`` (the variable ``vagent serve-env`` reads too), "" sends none.
    """

    def __init__(self, url_or_urls: str | Sequence[str], token: str | None = None, timeout: float = 60.0,
                 retry_timeout: float = 60.0, backoff: float = 0.05, max_backoff: float = 2.0,
                 max_connections: int = 64, images: str = "auto") -> None:
        urls = [url_or_urls] if isinstance(url_or_urls, str) else list(url_or_urls)
        if not urls or not all(isinstance(u, str) and u.startswith(("http://", "https://")) for u in urls):
            raise ValueError(f"expected one or more server URLs like 'http://127.0.0.1:8000', got {url_or_urls!r}")
        self.urls = [u.rstrip("/") for u in urls]
        self.current = 0
        self.retry_timeout, self.backoff, self.max_backoff = retry_timeout, backoff, max_backoff
        self.images = resolve_image_codec(images, self.urls)
        headers = {P.IMAGES_HEADER: self.images}
        self.token = token = service_token(token)  # the resolved token (None: none is sent)
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self.http = HttpClient(timeout=timeout, headers=headers, max_connections=max_connections)
        self.rng = random.Random()
        #: (env name, client config) -> (config hash, resolved config) of the first session made
        #: through this transport: every later session of that env and config must match it
        self.pins: dict[str, tuple[str, dict]] = {}

    def _sleep(self, attempt: int, retry_after: float | None) -> None:
        delay = min(self.max_backoff, self.backoff * 2 ** min(attempt, 16) * self.rng.uniform(0.5, 1.5))
        if retry_after is not None:
            delay = max(delay, min(retry_after, self.max_backoff * 4))
        time.sleep(delay)

    def send(self, method: str, path: str, body: Any = None, *, base: int | None = None) -> tuple[HttpResponse, int]:
        """Send a request; returns (response, index of the URL that answered).

        ``base=None``: any server, failing over across URLs until ``retry_timeout``.
        ``base=k``: the server holding a session: two quick retries (safe, steps carry their
        index), then :class:`_SessionLost` so the caller restores the session elsewhere.
        """
        deadline = time.monotonic() + self.retry_timeout
        attempt, n = 0, len(self.urls)
        content, headers = (None, None) if body is None else (_dumps(body), _JSON_HEADERS)
        while True:
            k = self.current if base is None else base
            retry_after = None
            try:
                _count("requests")
                r = self.http.request(method, self.urls[k] + path, content=content, headers=headers)
                if r.status_code != 503:
                    return r, k
                why = f"503 {_body(r)}"
                try:
                    retry_after = float(r.headers.get("retry-after", ""))
                except ValueError:
                    pass
                if base is not None:  # a session call answered 503: its worker died, the session is gone
                    self._advance(k)
                    raise _SessionLost(why)
            except TransportError as exc:
                why = str(exc)
            attempt += 1
            _count("retries")
            if base is not None and attempt >= 3:
                self._advance(k)
                raise _SessionLost(why)
            if base is None and n > 1:
                self._advance(k)
            if time.monotonic() > deadline:
                raise ServiceUnavailable(503, "Unavailable", f"no env server answered within {self.retry_timeout}s "
                                         f"(tried {', '.join(self.urls)}); last error: {why}")
            if base is not None or n == 1 or attempt % n == 0:
                self._sleep(attempt, retry_after)

    def _advance(self, k: int) -> None:
        if len(self.urls) > 1 and self.current == k:
            self.current = (k + 1) % len(self.urls)
            _count("failovers")

    def close(self) -> None:
        self.http.close()

    def create_pinned(self, path: str, body: dict, key: str, what: str) -> tuple[dict, list[bytes], int]:
        """POST a create (``path``: the session or batch route) on the first server, in failover
        order, that does not answer ``ConfigMismatch``; (frame header, parts, server index).

        A server that refuses the pinned config hash is skipped (each URL once); when all refuse,
        :class:`EnvConfigMismatch` names, per server, the fields that differ from the pinned config."""
        refusals: list[str] = []
        last: EnvConfigMismatch | None = None
        for _ in range(len(self.urls)):
            r, k = self.send("POST", path, body)
            try:
                header, parts = _decode(r)
            except EnvConfigMismatch as exc:
                refusals.append(f"{self.urls[k]}: {config_diff(self.pins.get(key, ('', {}))[1], exc.config)}")
                last = exc
                self._advance(k)
                continue
            return header, parts, k
        assert last is not None
        raise mismatch_error(self.urls, what, refusals, last.config)


def mismatch_error(urls: Sequence[str], what: str, refusals: list[str], config: dict | None) -> EnvConfigMismatch:
    """The error when every server refused a pinned config hash (``refusals``: one line per server)."""
    return EnvConfigMismatch(409, "ConfigMismatch", f"{what} cannot continue under the env config it started "
                             f"with: no server of {', '.join(urls)} resolves it alike ({'; '.join(refusals)}). "
                             "Give every server of the list the same --env-config, or drop the servers "
                             "configured otherwise from the list.", config)


def config_diff(want: dict, got: dict | None) -> str:
    """``"max_steps 20 -> 3"``: the fields of resolved config ``got`` that differ from ``want``."""
    if got is None:
        return "another config"
    diffs = [f"{k} {want.get(k, '<unset>')!r} -> {got.get(k, '<unset>')!r}"
             for k in sorted(set(want) | set(got)) if want.get(k, _MISSING) != got.get(k, _MISSING)]
    return ", ".join(diffs) or "another config"


_MISSING = object()
_JSON_HEADERS = {"Content-Type": "application/json"}

#: the environment variable that holds the env servers' bearer token (server and client read it)
TOKEN_VARIABLE = "VAGENT_SERVICE_TOKEN"


def service_token(token: str | None) -> str | None:
    """The token to send: ``token`` when given (``""``: none), else ``$VAGENT_SERVICE_TOKEN``."""
    if token is not None:
        return token or None
    return os.environ.get(TOKEN_VARIABLE) or None


def resolve_image_codec(images: str, urls: Sequence[str]) -> str:
    """``auto`` -> ``raw`` when every URL's host is loopback (one machine: CPU, not bytes, is
    scarce), else ``zlib``; other values must be one of protocol.IMAGE_CODECS."""
    if images == "auto":
        from urllib.parse import urlsplit

        return "raw" if all(P.is_loopback(urlsplit(u).hostname or "") for u in urls) else "zlib"
    if images not in P.IMAGE_CODECS:
        raise ValueError(f"images must be 'auto' or one of {', '.join(P.IMAGE_CODECS)}, got {images!r}")
    return images


def _dumps(body: Any) -> bytes:
    """JSON bytes of ``body``; strings with lone surrogates (not UTF-8-encodable) go as escapes."""
    try:
        return json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(body, ensure_ascii=True, separators=(",", ":"), allow_nan=False).encode("ascii")


def _decode(r: HttpResponse) -> tuple[dict, list[bytes]]:
    """The frame of a 200 response; raises the mapped exception for an error response."""
    if r.status_code != 200:
        _raise_error(r.status_code, _body(r))
    return P.decode_frames(r.content)


def _json(r: HttpResponse) -> Any:
    if r.status_code != 200:
        _raise_error(r.status_code, _body(r))
    return r.json()


def _step_result(d: dict, parts: list[bytes]) -> StepResult:
    """A StepResult from a frame header entry, validated by the shared model ``StepOut``."""
    m = P.StepOut.model_validate(d)
    return StepResult(obs=P.observation_from_wire(m.obs, parts), reward=m.reward,
                      terminated=m.terminated, truncated=m.truncated, info=m.info)


def _reset_result(d: dict, parts: list[bytes]) -> tuple[Observation, dict]:
    """(obs, info) from a frame header entry, validated by the shared model ``ResetOut``."""
    m = P.ResetOut.model_validate(d)
    return P.observation_from_wire(m.obs, parts), m.info
