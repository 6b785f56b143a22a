"""``vagent serve-env``: serve registered envs over HTTP (see docs/service.md).

Light on purpose: the server (FastAPI, uvicorn) is imported only when the command runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of ``vagent serve-env`` (shared with ``python -m vagent.service.server``)."""
    p.add_argument("--host", default="127.0.0.1", help="address to listen on; non-loopback needs --token (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="TCP port (default 8000)")
    p.add_argument("--envs", default="", help="comma-separated env names to serve (default: every registered env)")
    p.add_argument("--token", default=None,
                   help="bearer token clients must send (or set VAGENT_SERVICE_TOKEN); required off loopback")
    p.add_argument("--max-sessions", type=int, default=1024, help="most live sessions; beyond: 503 + Retry-After (default 1024)")
    p.add_argument("--session-ttl", type=float, default=600.0, help="seconds idle before a session is closed (default 600)")
    p.add_argument("--workers", type=int, default=1,
                   help="env processes: 1 = envs in the server's thread pool; W>=2 = W worker processes (default 1)")
    p.add_argument("--max-body-bytes", type=int, default=1 << 20, help="largest request body; beyond: 413 (default 1 MiB)")
    p.add_argument("--png-level", type=int, default=1, help="PNG zlib level 0-9, lossless at all levels (default 1)")
    p.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                   help="module or .py file to import first (registers your own envs); repeatable")
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
    from vagent.service.server import StartupError

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


def config_from_args(args: argparse.Namespace) -> Any:
    from vagent.service.server import ServerConfig

    return ServerConfig(
        host=args.host, port=args.port,
        envs=tuple(e.strip() for e in args.envs.split(",") if e.strip()),
        token=args.token, max_sessions=args.max_sessions, session_ttl=args.session_ttl,
        workers=args.workers, max_body_bytes=args.max_body_bytes, png_level=args.png_level,
        imports=tuple(args.imports), log_level=args.log_level, env_config=parse_env_config(args.env_config),
        header_timeout=args.header_timeout, read_timeout=args.read_timeout,
        keep_alive_timeout=args.keep_alive_timeout, max_connections_per_client=args.max_connections_per_client,
    )


def _serve(args: argparse.Namespace) -> int:
    from vagent.service.server import StartupError, serve

    try:
        serve(config_from_args(args))
    except StartupError as exc:
        print(f"vagent serve-env: error: {exc}", file=sys.stderr)
        return 2
    return 0


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("serve-env", help="serve envs over HTTP for remote rollouts",
                              description="Serve registered envs over HTTP (docs/service.md).")
    add_arguments(p)
    p.set_defaults(func=_serve)
