"""The settings of ``vagent serve-env``: :class:`ServerConfig`, its validation, and the command-line
flags that make it (shared by ``vagent serve-env`` and ``python -m vagent.service.server``).

Light: no FastAPI or uvicorn here, so the CLI can parse and check flags without importing them.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from typing import Any

from vagent.plugins import add_import_argument
from vagent.service.protocol import is_loopback


@dataclass
class ServerConfig:
    """Settings of ``vagent serve-env`` (each is also a command-line flag)."""

    #: address to listen on; any address that is not loopback requires a token
    host: str = "127.0.0.1"
    #: TCP port to listen on, 1..65535; 0 picks a free port (the start-up line names it)
    port: int = 8000
    #: env names that may be created (empty: every registered env)
    envs: tuple[str, ...] = ()
    #: bearer token clients must send (None: no auth, allowed on loopback only); also read from
    #: the VAGENT_SERVICE_TOKEN environment variable
    token: str | None = None
    #: the most live sessions; a create beyond it answers 503 with Retry-After
    max_sessions: int = 1024
    #: seconds a session may stay idle before the sweeper closes it
    session_ttl: float = 600.0
    #: env processes: 1 runs envs in the server's thread pool, W >= 2 in W worker processes
    workers: int = 1
    #: the largest request body accepted, in bytes (413 beyond)
    max_body_bytes: int = 1 << 20
    #: zlib level of the PNG encoder, 0-9 (lossless at every level; 1 is the fastest that compresses)
    png_level: int = 1
    #: modules (dotted names or .py paths) to import before serving: they register extra envs
    imports: tuple[str, ...] = ()
    #: uvicorn log level (critical, error, warning, info, debug)
    log_level: str = "warning"
    #: the operator's env config per env name ({"svg": {"svg_dir": "/data/svg"}}): merged under every
    #: client config; the only way to set server-only fields (--env-config svg.svg_dir=/data/svg)
    env_config: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: seconds a request's headers may take to arrive (from its first byte); 408 and close beyond
    header_timeout: float = 10.0
    #: seconds a request's body may take to arrive after its headers; 408 and close beyond
    read_timeout: float = 30.0
    #: seconds an idle keep-alive connection stays open between requests
    keep_alive_timeout: float = 30.0
    #: open connections one client address may hold (one more is answered 503 and closed)
    max_connections_per_client: int = 128


class StartupError(RuntimeError):
    """The server refuses to start (e.g. a non-loopback host without a token)."""


def validate_config(cfg: ServerConfig) -> None:
    """Refuse configurations that are unsafe or meaningless, saying how to fix them."""
    if not is_loopback(cfg.host) and not cfg.token:
        raise StartupError(
            f"refusing to listen on non-loopback host {cfg.host!r} without a token: anyone who can reach "
            "the port could run envs. Pass --token T (or set VAGENT_SERVICE_TOKEN) and give clients the "
            "same token, or listen on 127.0.0.1."
        )
    if not 0 <= cfg.port <= 65535:  # the kernel would take the port modulo 65536 (70000 -> 4464)
        raise StartupError(f"--port must be in 1..65535 (or 0: any free port), got {cfg.port}")
    if cfg.token is not None and len(cfg.token) < 8:
        raise StartupError("--token must be at least 8 characters (use e.g. `python -c 'import secrets; print(secrets.token_urlsafe())'`).")
    for name, value, low in (("max_sessions", cfg.max_sessions, 1), ("workers", cfg.workers, 1),
                             ("max_body_bytes", cfg.max_body_bytes, 1024),
                             ("max_connections_per_client", cfg.max_connections_per_client, 1)):
        if value < low:
            raise StartupError(f"--{name.replace('_', '-')} must be >= {low}, got {value}")
    for name in ("session_ttl", "header_timeout", "read_timeout", "keep_alive_timeout"):
        value = getattr(cfg, name)
        if not (value > 0 and value < float("inf")):
            raise StartupError(f"--{name.replace('_', '-')} must be a finite number of seconds > 0, got {value}")
    if not 0 <= cfg.png_level <= 9:
        raise StartupError(f"--png-level must be in 0..9, got {cfg.png_level}")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of ``vagent serve-env`` (shared with ``python -m vagent.service.server``)."""
    p.add_argument("--host", default="127.0.0.1", help="address to listen on; non-loopback needs --token (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="TCP port 1..65535, or 0 for any free port (default 8000)")
    p.add_argument("--envs", default="", help="comma-separated env names to serve (default: every registered env)")
    p.add_argument("--token", default=None,
                   help="bearer token clients must send (or set VAGENT_SERVICE_TOKEN); required off loopback")
    p.add_argument("--max-sessions", type=int, default=1024, help="most live sessions; beyond: 503 + Retry-After (default 1024)")
    p.add_argument("--session-ttl", type=float, default=600.0, help="seconds idle before a session is closed (default 600)")
    p.add_argument("--workers", type=int, default=1,
                   help="env processes: 1 = envs in the server's thread pool; W>=2 = W worker processes (default 1)")
    p.add_argument("--max-body-bytes", type=int, default=1 << 20, help="largest request body; beyond: 413 (default 1 MiB)")
    p.add_argument("--png-level", type=int, default=1, help="PNG zlib level 0-9, lossless at all levels (default 1)")
    add_import_argument(p)
    p.add_argument("--log-level", default="warning", help="uvicorn log level (default warning)")
    p.add_argument("--env-config", dest="env_config", action="append", default=[], metavar="ENV.FIELD=VALUE",
                   help="the operator's value of an env config field for every session of ENV (VALUE is JSON, or a "
                        "plain string); the only way to set server-only fields such as svg.svg_dir; repeatable")
    p.add_argument("--header-timeout", type=float, default=10.0,
                   help="seconds a request's headers may take to arrive; 408 and close beyond (default 10)")
    p.add_argument("--read-timeout", type=float, default=30.0,
                   help="seconds a request's body may take after its headers; 408 and close beyond (default 30)")
    p.add_argument("--keep-alive-timeout", type=float, default=30.0,
                   help="seconds an idle keep-alive connection stays open (default 30)")
    p.add_argument("--max-connections-per-client", type=int, default=128,
                   help="open connections one client address may hold; one more gets 503 (default 128)")


def parse_env_config(items: list[str]) -> dict[str, dict[str, Any]]:
    """``["svg.svg_dir=/data/svg", "gym.env_kwargs={\"map_name\": \"8x8\"}"]`` -> per-env dicts.
    A VALUE that parses as JSON is that JSON value, anything else the plain string."""
    out: dict[str, dict[str, Any]] = {}
    for item in items:
        key, eq, raw = item.partition("=")
        env, dot, name = key.strip().partition(".")
        if not eq or not dot or not env or not name:
            raise StartupError(f"--env-config {item!r}: expected ENV.FIELD=VALUE, e.g. svg.svg_dir=/data/svg.")
        try:
            value = json.loads(raw)
        except ValueError:
            value = raw
        out.setdefault(env, {})[name] = value
    return out


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    """The :class:`ServerConfig` of parsed ``vagent serve-env`` flags."""
    return ServerConfig(
        host=args.host, port=args.port,
        envs=tuple(e.strip() for e in args.envs.split(",") if e.strip()),
        token=args.token, max_sessions=args.max_sessions, session_ttl=args.session_ttl,
        workers=args.workers, max_body_bytes=args.max_body_bytes, png_level=args.png_level,
        imports=tuple(args.imports), log_level=args.log_level, env_config=parse_env_config(args.env_config),
        header_timeout=args.header_timeout, read_timeout=args.read_timeout,
        keep_alive_timeout=args.keep_alive_timeout, max_connections_per_client=args.max_connections_per_client,
    )
