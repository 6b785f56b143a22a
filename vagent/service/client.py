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
``RemoteEnvPool``, and the factories that plug remote envs into the rollout). The wire layer
(:class:`Transport`, the exceptions, :func:`client_metrics`) is :mod:`vagent.service.transport`.

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
import threading
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Callable, Sequence

from vagent.envs.base import EnvError, JudgeSpec, Observation, StepResult
from vagent.service import protocol as P
from vagent.service.httpclient import TransportError

# the wire layer; its public names (and the helpers vagent.service.batch uses) stay importable from here
from vagent.service.transport import (  # noqa: F401
    TOKEN_VARIABLE, EnvConfigMismatch, RemoteEnvException, ServiceError, ServiceUnavailable, Transport, _count,
    _decode, _json, _raise_error, _reset_result, _SessionLost, _step_result, client_metrics, config_diff,
    mismatch_error, resolve_image_codec, service_token,
)


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

    def __exit__(self, *exc: object) -> None:
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
