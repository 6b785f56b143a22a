"""The client: :class:`RemoteEnv`, an env whose instance lives in a ``vagent serve-env`` server.

``RemoteEnv(url_or_urls, env_name, token=None, timeout=60.0, **config)`` satisfies the env
contract (``reset``/``step``/``system_prompt``/``state``/``close``, ``optimal_actions`` when the
remote env has a solver) and passes ``check_env`` like the local env.

No lost episodes. Envs are deterministic given the seed and the replies, so the client records
the seed of the current episode and every reply it stepped. When the session disappears (the
server restarted, the session expired, a worker died, the server is unreachable and another URL
takes over) the client creates a new session on a live server, resets it with the same seed and
replays the recorded replies in the same round trip (``CreateRequest.replay``), checks that the
restored observation, reward and end flags equal the ones it already returned (a mismatch is an
:class:`EnvError`: the env is not deterministic), and then sends the call again. Each restore
counts in ``service/replays``; see :func:`client_metrics`.

Retries: connection errors and 503 are retried with jittered exponential backoff
(``backoff * 2**attempt * U(0.5, 1.5)``, capped at ``max_backoff``; 503's Retry-After is honored)
until ``retry_timeout`` seconds have passed, rotating through the server URLs (failover). Steps
carry their index in the episode, so a retried step that the server already applied is answered
from its record instead of being applied twice.

Many envs at once: see :mod:`vagent.service.batch` (``step_many``, ``reset_many``,
``RemoteEnvPool``, and the factories that plug remote envs into the rollout).

RemoteEnv as an env (the template sections of an env module):

Action format:
    exactly the remote env's (``env.action_names``, ``env.action_sep`` and ``env.config``
    mirror the remote env's resolved config, sent by the server when the session is created).

Observation:
    the remote env's ``Observation``; images travel losslessly (raw pixels on loopback, zlib or
    PNG across machines: ``images=``) and decode to the same mode, size and pixels.

Rewards:
    the remote env's, unchanged (floats survive JSON exactly). An env exception on the server is
    a :class:`RemoteEnvException`, never a reward.

Episode end:
    the remote env's ``terminated``/``truncated``; a step after the end raises
    ``EpisodeOverError`` as locally.

Arguments:
    see :class:`RemoteEnvConfig` (the client's settings); the env's own config goes in
    ``**config`` and is validated by the server (``ConfigError`` as locally).

Version:
    v1 of the wire protocol (``/v1`` routes, ``VAGF`` frames). Deviations from a local env:
    ``state()`` and ``info`` pass through JSON (tuples become lists, numpy values numbers,
    unknown objects their ``str``); replies with lone surrogate code points are sent as JSON
    escapes.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Callable, Sequence

from vagent.config import ConfigError
from vagent.envs.base import EnvError, EpisodeOverError, JudgeSpec, Observation, StepResult
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


def _same_obs(a: Observation, b: Observation) -> bool:
    return a.text == b.text and len(a.images) == len(b.images) and all(
        x.mode == y.mode and x.size == y.size and x.tobytes() == y.tobytes() for x, y in zip(a.images, b.images))


@dataclass
class RemoteEnvConfig:
    """The client-side settings of a :class:`RemoteEnv` (the env's own config is separate)."""

    #: server URLs, tried in order (failover); one URL is fine
    urls: tuple[str, ...] = ("http://127.0.0.1:8000",)
    #: the registered env name on the server
    env: str = ""
    #: bearer token of the server (None: $VAGENT_SERVICE_TOKEN if set, else none, for a server
    #: without auth on loopback)
    token: str | None = None
    #: seconds one HTTP request may take (a step of a slow simulator included)
    timeout: float = 60.0
    #: seconds one call may spend retrying connection errors / 503 and restoring lost sessions
    retry_timeout: float = 60.0


class RemoteEnv:
    """An env served by ``vagent serve-env``: the same contract as ``vagent.envs.make(env_name, **config)``.

    ``url_or_urls``: one server URL or several (failover, in order); ``token``: the server's
    bearer token; ``timeout``: seconds per HTTP request; ``retry_timeout``: seconds a call may
    spend retrying and restoring; ``images``: the image codec (``auto``, ``png``, ``raw``,
    ``zlib``; see :class:`Transport`); ``**config``: the env's config (validated by the server
    now, as ``make`` does locally; the names ``token``, ``timeout``, ``retry_timeout``,
    ``transport`` and ``images`` are the client's). ``transport`` shares one connection pool
    between envs.

    Attributes mirroring the local env: ``config`` (the resolved env config, read-only),
    ``action_names``, ``action_sep``, ``judge_spec``, ``spec_name``/``spec_config`` (what
    ``make`` was given), and ``optimal_actions`` only when the remote env has a solver.
    """

    Config = RemoteEnvConfig

    def __init__(self, url_or_urls: str | Sequence[str], env_name: str, token: str | None = None,
                 timeout: float = 60.0, *, retry_timeout: float = 60.0, transport: Transport | None = None,
                 images: str = "auto", _created: tuple[dict, int] | None = None, **config: Any) -> None:
        self.env_name = env_name
        self.spec_name, self.spec_config = env_name, dict(config)
        self._own = transport is None
        self._t = transport or Transport(url_or_urls, token, timeout, retry_timeout, images=images)
        self.settings = RemoteEnvConfig(urls=tuple(self._t.urls), env=env_name, token=token, timeout=timeout,
                                        retry_timeout=retry_timeout)
        self.config: Any = SimpleNamespace()
        self.action_names: tuple[str, ...] = ()
        self.action_sep = ","
        self.reply_stop: tuple[str, ...] = ()
        self.judge_spec: JudgeSpec | None = None
        self._lock = threading.RLock()
        self._sid: str | None = None
        self._base = 0
        self._seed: int | None = None
        self._responses: list[str] = []
        self._last_reset: tuple[Observation, dict] | None = None
        self._last_step: StepResult | None = None
        self.solvable = False
        self.closed = False
        try:
            if _created is not None:
                self._adopt(*_created)
            else:
                self._create(seed=None, replay=[])
        except BaseException:
            if self._own:
                self._t.close()
            raise

    # -- sessions
    def _adopt(self, header: dict, base: int) -> None:
        created = P.CreateOut.model_validate(header)
        self._pin(created)
        self._sid, self._base, self.solvable = created.session_id, base, created.solvable
        spec = created.spec
        self.config = SimpleNamespace(**spec.get("config", {}))
        self.action_names = tuple(spec.get("action_names", ()))
        self.action_sep = spec.get("action_sep", ",")
        self.reply_stop = tuple(spec.get("reply_stop", ()))
        js = spec.get("judge_spec")
        if js:
            self.judge_spec = JudgeSpec(
                object_weights=dict(js["object_weights"]),
                synonyms={k: tuple(v) for k, v in js.get("synonyms", {}).items()},
                vertical_words=tuple(js.get("vertical_words", ("above", "below", "same"))),
                horizontal_words=tuple(js.get("horizontal_words", ("left", "right", "same"))),
            )

    @property
    def _pin_key(self) -> str:
        return json.dumps([self.env_name, self.spec_config], sort_keys=True, default=str)

    def _create_request(self, seed: int | None, replay: list[str]) -> dict:
        """A create of this env; once a session was made, with the config hash it must keep."""
        pin = self._t.pins.get(self._pin_key)
        return {"env": self.env_name, "config": self.spec_config, "seed": seed, "replay": replay,
                "config_hash": pin[0] if pin else None}

    def _pin(self, created: P.CreateOut) -> None:
        """The first session of this env and config on this transport fixes the config hash."""
        if created.config_hash:
            self._t.pins.setdefault(self._pin_key, (created.config_hash, dict(created.spec.get("config", {}))))

    def __getattr__(self, name: str) -> Any:
        # optimal_actions exists only when the remote env has a solver, as on the local env
        # (the checker and the rollout test ``callable(getattr(env, "optimal_actions", None))``)
        if name == "optimal_actions" and self.__dict__.get("solvable"):
            return self._optimal_actions
        raise AttributeError(f"{type(self).__name__!s} has no attribute {name!r}")

    def _create(self, seed: int | None, replay: list[str]) -> tuple[dict, list[bytes]]:
        header, parts, k = self._t.create_pinned(f"{P.API_PREFIX}/sessions", self._create_request(seed, replay),
                                                 self._pin_key, f"env '{self.env_name}' (seed {seed}, "
                                                 f"{len(replay)} replies to replay)")
        self._adopt(header, k)
        return header, parts

    def _restore(self) -> None:
        """Recreate the session on a live server and replay the episode so far (verified)."""
        self._sid = None
        header, parts = self._create(self._seed, list(self._responses) if self._seed is not None else [])
        _count("replays")
        _count("replayed_steps", len(self._responses) if self._seed is not None else 0)
        self._verify(header, parts)

    def _verify(self, header: dict, parts: list[bytes]) -> None:
        if self._seed is None:
            return
        if self._responses:
            got, want = _step_result(header["last_step"], parts), self._last_step
            same = want is not None and _same_obs(got.obs, want.obs) and (got.reward, got.terminated, got.truncated) == (
                want.reward, want.terminated, want.truncated)
        else:
            got_obs = _reset_result(header["reset"], parts)[0]
            same = self._last_reset is not None and _same_obs(got_obs, self._last_reset[0])
        if not same:
            raise EnvError(f"restoring env '{self.env_name}' (seed {self._seed}, {len(self._responses)} replies replayed) "
                           "gave a different observation or reward than the original episode: the env is not "
                           "deterministic given its seed and replies, so lost sessions cannot be restored.")

    def _call(self, fn: Callable[[], Any], restore: bool = True) -> Any:
        """Run ``fn`` against the session, restoring it (at most 5 times) when it is lost.

        ``restore=False``: ``fn`` handles a missing session itself (reset creates one).
        """
        with self._lock:
            if self.closed:
                raise EnvError(f"RemoteEnv '{self.env_name}' is closed; create a new one.")
            for _ in range(5):
                try:
                    if self._sid is None and restore:
                        self._restore()
                    return fn()
                except _SessionLost:
                    self._sid = None
            raise ServiceUnavailable(503, "Unavailable", f"session of env '{self.env_name}' was lost 5 times in a row")

    def _forget_if_closed(self, exc: RemoteEnvException) -> None:
        if exc.session_closed:
            self._sid = None

    # -- the env contract
    def reset(self, seed: int) -> tuple[Observation, dict]:
        seed = int(seed)

        def go() -> tuple[Observation, dict]:
            if self._sid is None:  # no session to reset: create one reset in the same round trip
                header, parts = self._create(seed, [])
                d = header["reset"]
            else:
                r, _ = self._t.send("POST", f"{P.API_PREFIX}/sessions/{self._sid}/reset", {"seed": seed}, base=self._base)
                d, parts = _decode(r)
            return _reset_result(d, parts)

        with self._lock:
            self._seed, self._responses, self._last_step = None, [], None  # nothing to replay until it succeeds
            try:
                out = self._call(go, restore=False)
            except RemoteEnvException as exc:
                self._forget_if_closed(exc)
                raise
            self._seed, self._last_reset = seed, out
            return out

    def step(self, response: str) -> StepResult:
        def go() -> StepResult:
            body = {"response": response, "index": len(self._responses) if self._seed is not None else None}
            r, _ = self._t.send("POST", f"{P.API_PREFIX}/sessions/{self._sid}/step", body, base=self._base)
            header, parts = _decode(r)
            return _step_result(header, parts)

        with self._lock:
            try:
                res = self._call(go)
            except RemoteEnvException as exc:
                self._forget_if_closed(exc)
                raise
            self._record(response, res)
            return res

    def _record(self, response: str, res: StepResult) -> None:
        if self._seed is not None:
            self._responses.append(response)
        self._last_step = res

    def _get(self, what: str) -> Any:
        return self._call(lambda: _json(self._t.send("GET", f"{P.API_PREFIX}/sessions/{self._sid}/{what}", base=self._base)[0]))

    def system_prompt(self) -> str:
        return self._get("system_prompt")["system_prompt"]

    def state(self) -> dict:
        return self._get("state")["state"]

    def remote_source(self) -> tuple[list[str], str | None]:
        """(server URLs, token): what a fresh process needs to make this env again (``check_env``'s
        fresh-process check of an env that is registered only on the server)."""
        return list(self._t.urls), self._t.token

    def _optimal_actions(self) -> list[str]:
        """The solver's next actions (reachable as ``optimal_actions`` when the env has a solver)."""
        return self._get("optimal_actions")["actions"]

    def close(self) -> None:
        """Close the remote session (best effort: a dead server already dropped it) and the pool."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            if self._sid is not None:
                try:
                    self._t.http.request("DELETE", f"{self._t.urls[self._base]}{P.API_PREFIX}/sessions/{self._sid}",
                                         timeout=5.0)
                except TransportError:
                    pass
                self._sid = None
            if self._own:
                self._t.close()

    def __enter__(self) -> "RemoteEnv":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RemoteEnv({self._t.urls[self._base]!r}, {self.env_name!r}, session={self._sid!r})"

    @property
    def session_id(self) -> str | None:
        return self._sid

    @property
    def recorded(self) -> tuple[int | None, tuple[str, ...]]:
        """(seed, replies) of the current episode: what a restore replays."""
        return self._seed, tuple(self._responses)
