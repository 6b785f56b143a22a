"""``vagent serve-env``: serve registered envs over HTTP (see docs/service.md).

Light on purpose: the server (FastAPI, uvicorn) is imported only when the command runs; the flags
and the config they make live in :mod:`vagent.service.config`.
"""

from __future__ import annotations

import argparse
import sys

from vagent.service.config import StartupError, add_arguments, config_from_args, validate_config


def _serve(args: argparse.Namespace) -> int:
    try:
        cfg = config_from_args(args)
        validate_config(cfg)  # flags are refused in one line before FastAPI and the envs are imported
        from vagent.service.server import serve

        serve(cfg)
    except StartupError as exc:
        print(f"vagent serve-env: error: {exc}", file=sys.stderr)
        return 2
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("serve-env", help="serve envs over HTTP for remote rollouts",
                              description="Serve registered envs over HTTP (docs/service.md).")
    add_arguments(p)
    p.set_defaults(func=_serve)
