"""Before a run builds its model: every env server of the run config checked, and what the trainer
needs to know about a remote env (it may live only on the server) asked of the server.

``check_env_servers(entries)``: for each ``envs.N`` entry with ``urls``, each URL gets one request,
``GET /v1/envs/{name}`` with the entry's token; the answer tells all three things at once
(reachable, token accepted, env served). Returns one line per server; raises :class:`ServerCheckError`
with one line per server that failed, each with its fix. No retries: a server that is not up
when the run starts is a mistake to report, not to wait for.

``remote_env_info(entry)``: the env's :class:`~vagent.service.protocol.EnvInfoOut` (description,
``reply_stop``, actions, config fields) from the entry's first server that answers, cached for the
process. ``vagent.rollout.specs.stop_strings`` reads ``reply_stop`` from it, so the trainer never
imports a remote env's class.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Sequence

from vagent.config import ConfigError
from vagent.service import protocol as P
from vagent.service.client import TOKEN_VARIABLE, service_token
from vagent.service.httpclient import HttpClient, TransportError


class ServerCheckError(ConfigError):
    """An env server of the run config is unreachable, refuses the token, or does not serve the env."""


@dataclass(frozen=True)
class ServerCheck:
    """The outcome of one server's check: ``line`` says what was found (and the fix when not ok)."""

    where: str  # "envs.0 (corridor) at http://127.0.0.1:8100"
    ok: bool
    line: str
    info: P.EnvInfoOut | None = None


def check_server(url: str, env: str, token: str | None, where: str, timeout: float = 10.0) -> ServerCheck:
    """One ``GET /v1/envs/{env}`` on ``url`` (see the module docstring); never raises."""
    sent = service_token(token)
    headers = {"Authorization": f"Bearer {sent}"} if sent else {}
    http = HttpClient(timeout=timeout, headers=headers, max_connections=1)
    try:
        r = http.request("GET", f"{url.rstrip('/')}{P.API_PREFIX}/envs/{env}")
    except TransportError as exc:
        return ServerCheck(where, False, f"{where}: unreachable ({exc}). Start it (vagent serve-env --envs {env} "
                                         "...) or fix the URL in envs.N.urls.")
    finally:
        http.close()
    body = _json(r)
    detail = str(body.get("detail", "")) if isinstance(body, dict) else str(body)[:300]
    if r.status_code == 200:
        info = P.EnvInfoOut.model_validate(body)
        return ServerCheck(where, True, f"{where}: ok (token {'sent' if sent else 'none'}): {info.description}", info)
    if r.status_code == 401:
        fix = ("the token was refused: give the token the server was started with" if sent else
               "the server requires a token and none was sent: set it")
        return ServerCheck(where, False,
                           f"{where}: {fix} in envs.N.token or the environment variable {TOKEN_VARIABLE}.")
    if r.status_code == 422 and isinstance(body, dict) and body.get("error") == "UnknownEnv":
        return ServerCheck(where, False, f"{where}: the server does not serve '{env}' ({detail}) Start the server "
                                         f"with --envs {env} and the --import MODULE that registers it.")
    if r.status_code == 404:
        return ServerCheck(where, False, f"{where}: answered 404 to {P.API_PREFIX}/envs/{env}: not a vagent "
                                         "serve-env server of this version (update vagent on the server).")
    return ServerCheck(where, False, f"{where}: answered {r.status_code}: {detail}")


def _json(r: Any) -> Any:
    try:
        return r.json()
    except ValueError:
        return r.text


def check_env_servers(entries: Sequence[Any], timeout: float = 10.0) -> list[str]:
    """Check every server of every entry with ``urls`` (``EnvEntry``-like: ``name``, ``urls``,
    ``token``); returns one line per server, or raises :class:`ServerCheckError` listing the
    servers that failed (one line each). Successful answers fill :func:`remote_env_info`'s cache."""
    checks = []
    for i, e in enumerate(entries):
        for url in e.urls:
            c = check_server(url, e.name, getattr(e, "token", None), f"envs.{i} ({e.name}) at {url}", timeout)
            checks.append(c)
            if c.info is not None:
                with _INFO_LOCK:
                    _INFO.setdefault(_key(e), c.info)
    bad = [c.line for c in checks if not c.ok]
    if len(bad) == 1:
        raise ServerCheckError(bad[0])
    if bad:
        raise ServerCheckError(f"{len(bad)} env servers failed their check:\n  " + "\n  ".join(bad))
    return [c.line for c in checks]


_INFO: dict[tuple, P.EnvInfoOut] = {}
_INFO_LOCK = threading.Lock()


def _key(entry: Any) -> tuple:
    return tuple(entry.urls), entry.name, service_token(getattr(entry, "token", None))


def remote_env_info(entry: Any) -> P.EnvInfoOut:
    """What the servers of ``entry`` say about its env (cached per urls, name and token); raises
    :class:`ServerCheckError` when no server answers it."""
    key = _key(entry)
    with _INFO_LOCK:
        if key in _INFO:
            return _INFO[key]
    lines = []
    for url in entry.urls:
        c = check_server(url, entry.name, getattr(entry, "token", None), f"{entry.name} at {url}")
        if c.info is not None:
            with _INFO_LOCK:
                return _INFO.setdefault(key, c.info)
        lines.append(c.line)
    raise ServerCheckError("no env server described the env:\n  " + "\n  ".join(lines))
