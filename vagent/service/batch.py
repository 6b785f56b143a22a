"""Many RemoteEnvs at once: batch routes, pools, and env factories for the rollout.

- :func:`step_many` / :func:`reset_many`: one batch request per server for a list of RemoteEnvs;
  lost sessions are restored with one batch create (+ replay) and stepped again.
- :class:`RemoteEnvPool`: n sessions of one env created in one request.
- :func:`remote_env_factory` / :func:`remote_spec_factory`: zero-argument and ``(EnvSpec) ->``
  factories for ``vagent.rollout.rollout`` (the config switch from local to remote envs).
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

from vagent.envs.base import EnvError, Observation, StepResult
from vagent.service import protocol as P
from vagent.service.httpclient import TransportError
from vagent.service.client import (
    RemoteEnv, RemoteEnvException, ServiceUnavailable, Transport, _count, _decode, _raise_error, _reset_result,
    _SessionLost, _step_result, config_diff, mismatch_error,
)

if TYPE_CHECKING:
    from vagent.rollout.trajectory import EnvSpec


def _batch(transport: Transport, base: int, route: str, items: list[dict]) -> tuple[list[P.ItemResult], list[bytes]]:
    """POST a batch route to server ``base``; per-item results (validated) and the frame parts."""
    r, _ = transport.send("POST", f"{P.API_PREFIX}/batch/{route}", {"items": items}, base=base)
    header, parts = _decode(r)
    return P.BatchOut.model_validate(header).results, parts


def _item_error(res: P.ItemResult) -> None:
    assert res.error is not None
    _raise_error(res.status, res.error.model_dump())


def _restore_many(envs: list[RemoteEnv]) -> list[BaseException | None]:
    """Restore lost sessions of envs sharing one transport with one batch create (+ replay) per
    server; the error of each env (None: restored).

    Each create carries the env's pinned config hash: the envs a server refuses (409
    ``ConfigMismatch``, another operator config) are sent to the next server, each URL at most
    once; an env that no server takes gets :class:`EnvConfigMismatch` naming the fields."""
    t = envs[0]._t
    errors: list[BaseException | None] = [None] * len(envs)
    refusals: dict[int, list[str]] = {}
    configs: dict[int, dict | None] = {}
    todo = list(range(len(envs)))
    for _server in range(len(t.urls)):
        items = [envs[i]._create_request(envs[i]._seed, list(envs[i]._responses) if envs[i]._seed is not None else [])
                 for i in todo]
        r, k = t.send("POST", f"{P.API_PREFIX}/batch/create", {"items": items})
        header, parts = _decode(r)
        refused = []
        for i, res in zip(todo, P.BatchOut.model_validate(header).results):
            e = envs[i]
            try:
                if res.error is not None and res.error.error == "ConfigMismatch":
                    pinned = t.pins.get(e._pin_key, ("", {}))[1]
                    refusals.setdefault(i, []).append(f"{t.urls[k]}: {config_diff(pinned, res.error.config)}")
                    configs[i] = res.error.config
                    refused.append(i)
                    continue
                if res.error is not None:
                    _item_error(res)
                e._adopt(res.ok, k)
                _count("replays")
                _count("replayed_steps", len(e._responses) if e._seed is not None else 0)
                e._verify(res.ok, parts)
            except Exception as exc:  # noqa: BLE001 - handed back per env
                errors[i] = exc
        todo = refused
        if not todo:
            break
        t._advance(k)
    for i in todo:
        errors[i] = mismatch_error(t.urls, f"env '{envs[i].env_name}' (seed {envs[i]._seed}, "
                                   f"{len(envs[i]._responses)} replies to replay)", refusals[i], configs[i])
    return errors


def _many(envs: Sequence[RemoteEnv], args: Sequence[Any], route: str,
          item: Callable[[RemoteEnv, Any], dict], done: Callable[[RemoteEnv, Any, dict, list[bytes]], Any],
          return_exceptions: bool) -> list[Any]:
    if len(envs) != len(args):
        raise ValueError(f"got {len(envs)} envs but {len(args)} arguments; pass one per env")
    if len({id(e) for e in envs}) != len(envs):
        raise ValueError("the same RemoteEnv appears twice in one batch; step each env at most once per call")
    out: list[Any] = [None] * len(envs)
    todo = list(range(len(envs)))
    for _round in range(5):
        if not todo:
            break
        lost: list[int] = []
        groups: dict[tuple[int, int], list[int]] = {}
        for i in todo:
            e = envs[i]
            if e.closed:
                out[i] = EnvError(f"RemoteEnv '{e.env_name}' is closed")
            elif e._sid is None:
                lost.append(i)
            else:
                groups.setdefault((id(e._t), e._base), []).append(i)
        for (_, base), idx in groups.items():
            try:
                results, parts = _batch(envs[idx[0]]._t, base, route, [item(envs[i], args[i]) for i in idx])
            except _SessionLost:
                for i in idx:
                    envs[i]._sid = None
                lost.extend(idx)
                continue
            for i, res in zip(idx, results):
                if res.error is None:
                    out[i] = done(envs[i], args[i], res.ok, parts)
                    continue
                try:
                    _item_error(res)
                except _SessionLost:
                    envs[i]._sid = None
                    lost.append(i)
                except Exception as exc:  # noqa: BLE001 - handed back per item
                    if isinstance(exc, RemoteEnvException):
                        envs[i]._forget_if_closed(exc)
                    out[i] = exc
        by_t: dict[int, list[int]] = {}
        for i in lost:
            by_t.setdefault(id(envs[i]._t), []).append(i)
        for idx in by_t.values():
            try:
                errors = _restore_many([envs[i] for i in idx])
            except Exception as exc:  # noqa: BLE001
                errors = [exc] * len(idx)
            for i, err in zip(list(idx), errors):
                if err is not None:
                    out[i] = err
                    idx.remove(i)
        todo = sorted(i for idx in by_t.values() for i in idx)
    for i in todo:
        out[i] = ServiceUnavailable(503, "Unavailable", "session lost 5 times in a row")
    if not return_exceptions:
        for x in out:
            if isinstance(x, BaseException):
                raise x
    return out


@contextmanager
def _locked(envs: Sequence[RemoteEnv]) -> Iterator[None]:
    """Hold the locks of ``envs``, taken in one global order (by id) so that two batches over
    overlapping envs cannot deadlock."""
    ordered = sorted({id(e): e for e in envs}.values(), key=id)
    for e in ordered:
        e._lock.acquire()
    try:
        yield
    finally:
        for e in reversed(ordered):
            e._lock.release()


def step_many(envs: Sequence[RemoteEnv], responses: Sequence[str], *, return_exceptions: bool = False) -> list[Any]:
    """Step many RemoteEnvs with one batch request per server; results in order.

    Lost sessions are restored (batched) and stepped again. An env error raises after every
    other env was stepped (their records stay consistent); with ``return_exceptions=True`` it is
    returned in its slot instead.
    """

    def item(e: RemoteEnv, response: str) -> dict:
        return {"session_id": e._sid, "response": response, "index": len(e._responses) if e._seed is not None else None}

    def done(e: RemoteEnv, response: str, d: dict, parts: list[bytes]) -> StepResult:
        res = _step_result(d, parts)
        e._record(response, res)
        return res

    with _locked(envs):
        return _many(envs, responses, "step", item, done, return_exceptions)


def reset_many(envs: Sequence[RemoteEnv], seeds: Sequence[int], *, return_exceptions: bool = False) -> list[Any]:
    """Reset many RemoteEnvs with one batch request per server; ``[(obs, info), ...]`` in order."""

    def item(e: RemoteEnv, seed: int) -> dict:
        e._seed, e._responses, e._last_step = None, [], None
        return {"session_id": e._sid, "seed": int(seed)}

    def done(e: RemoteEnv, seed: int, d: dict, parts: list[bytes]) -> tuple[Observation, dict]:
        out = _reset_result(d, parts)
        e._seed, e._last_reset = int(seed), out
        return out

    with _locked(envs):
        for e in envs:  # a lost env is restored without an episode, then reset in the batch
            e._seed, e._responses, e._last_step = None, [], None
        return _many(envs, seeds, "reset", item, done, return_exceptions)


class RemoteEnvPool:
    """``n`` RemoteEnvs of one env on one transport, created in one request, stepped in batches.

    ``pool.reset(seeds)`` / ``pool.step(responses)`` return per-env results in order; ``pool[i]``
    is the i-th :class:`RemoteEnv` (usable on its own).
    """

    def __init__(self, url_or_urls: str | Sequence[str], env_name: str, n: int, token: str | None = None,
                 timeout: float = 60.0, *, retry_timeout: float = 60.0, images: str = "auto", **config: Any) -> None:
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        self.transport = Transport(url_or_urls, token, timeout, retry_timeout, images=images)
        item: dict[str, Any] = {"env": env_name, "config": config, "seed": None, "replay": []}
        self.envs: list[RemoteEnv] = []
        try:
            for start in range(0, n, P.MAX_BATCH):
                m = min(P.MAX_BATCH, n - start)
                r, k = self.transport.send("POST", f"{P.API_PREFIX}/batch/create", {"items": [item] * m})
                header, _ = _decode(r)
                for res in P.BatchOut.model_validate(header).results:
                    if res.error is not None:
                        _item_error(res)
                    self.envs.append(RemoteEnv(self.transport.urls, env_name, transport=self.transport,
                                               _created=(res.ok, k), **config))
        except BaseException:
            self.close()
            raise

    def reset(self, seeds: Sequence[int]) -> list[tuple[Observation, dict]]:
        return reset_many(self.envs, seeds)

    def step(self, responses: Sequence[str]) -> list[StepResult]:
        return step_many(self.envs, responses)

    def __len__(self) -> int:
        return len(self.envs)

    def __getitem__(self, i: int) -> RemoteEnv:
        return self.envs[i]

    def close(self) -> None:
        live = [e for e in self.envs if e._sid is not None and not e.closed]
        by_base: dict[int, list[str]] = {}
        for e in live:
            by_base.setdefault(e._base, []).append(e._sid)  # type: ignore[arg-type]
        for base, sids in by_base.items():
            for start in range(0, len(sids), P.MAX_BATCH):
                try:
                    self.transport.http.request(
                        "POST", f"{self.transport.urls[base]}{P.API_PREFIX}/batch/close",
                        content=json.dumps({"session_ids": sids[start:start + P.MAX_BATCH]}).encode(),
                        headers={"Content-Type": "application/json"}, timeout=5.0)
                except TransportError:
                    pass
        for e in self.envs:
            e._sid, e.closed = None, True
        self.transport.close()

    def __enter__(self) -> "RemoteEnvPool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def remote_env_factory(url_or_urls: str | Sequence[str], env_name: str, token: str | None = None,
                       timeout: float = 60.0, *, retry_timeout: float = 60.0, images: str = "auto",
                       **config: Any) -> Callable[[], RemoteEnv]:
    """A zero-argument callable making RemoteEnvs that share one connection pool (``timeout``
    seconds per request, ``retry_timeout`` per call across the URLs: :class:`Transport`).

    Like ``vagent.envs.env_factory`` it validates now: the first env is created here (the server
    checks the name and config) and handed out by the first call.
    """
    transport = Transport(url_or_urls, token, timeout, retry_timeout, images=images)
    first: list[RemoteEnv] = [RemoteEnv(transport.urls, env_name, transport=transport, **config)]

    def make() -> RemoteEnv:
        if first:
            return first.pop()
        return RemoteEnv(transport.urls, env_name, transport=transport, **config)

    make.transport = transport  # type: ignore[attr-defined]
    return make


def remote_spec_factory(url_or_urls: str | Sequence[str], token: str | None = None,
                        timeout: float = 60.0, *, images: str = "auto") -> Callable[[Any], RemoteEnv]:
    """An ``env_factory`` for ``vagent.rollout.rollout``: ``spec -> RemoteEnv(urls, spec.name, **spec.config)``.

    The config switch from local to remote envs: ``rollout(..., env_factory=remote_spec_factory(urls))``.
    All envs share one connection pool; ``images`` picks the image codec (see ``Transport``).
    """
    transport = Transport(url_or_urls, token, timeout, images=images)

    def make(spec: EnvSpec) -> RemoteEnv:
        return RemoteEnv(transport.urls, spec.name, transport=transport, **dict(spec.config))

    make.transport = transport  # type: ignore[attr-defined]
    return make
