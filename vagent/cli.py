"""The ``vagent`` command line. Each subsystem adds its own subcommands.

A subsystem's CLI module exposes ``add_parser(subparsers)`` (registering one or more commands
whose ``func`` default is a callable ``(args) -> int``) and keeps heavy imports inside the
command functions so that ``vagent --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# Modules that contribute subcommands, in the order they appear in --help.
_CLI_MODULES = (
    "vagent.envs.cli",        # envs, play
    "vagent.models.cli",      # model init-tiny, model info
    "vagent.recipes.cli",     # train, demos
    "vagent.service.cli",     # serve-env
    "vagent.eval.cli",        # eval
    "vagent.rewards.cli",     # judge-audit
    "vagent.vigorl.cli",      # vigorl ...
    "vagent.viewer.cli",      # view
    "vagent.sweep.cli",       # sweep, sweep report
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vagent", description="Train vision-language-model agents with multi-turn RL."
    )
    from vagent import __version__

    parser.add_argument("--version", action="version", version=f"vagent {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _CLI_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:  # subsystem not present in this build
                continue
            raise
        module.add_parser(sub)
    return parser


def _command_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The (sub)parser of the command ``args`` selected, following nested subcommands."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            chosen = action.choices.get(getattr(args, action.dest, None) or "")
            if chosen is not None:
                return _command_parser(chosen, args)
    return parser


def missing_dependency(exc: ImportError) -> str | None:
    """The one line a command ends with when a package it needs is not installed: vagent's own
    ImportErrors name the install that fixes it; a bare "No module named 'x'" gets the extra of
    vagent that installs x, if one does. None for an import of vagent itself that failed (a bug)."""
    chain: list[BaseException] = [exc]  # exc and the exceptions it was raised from or during
    while (before := chain[-1].__cause__ or chain[-1].__context__) is not None and len(chain) < 10:
        chain.append(before)
    if any(isinstance(e, ImportError) and (e.name or "").split(".")[0] == "vagent" for e in chain):
        return None
    if exc.name is not None and not isinstance(exc, ModuleNotFoundError):
        return None  # "cannot import name X from Y": an installed package of another version, not a missing one
    if not isinstance(exc, ModuleNotFoundError) or not exc.name:
        return str(exc)
    return f"{exc}: {_install_hint(exc.name)}"


def _install_hint(module: str) -> str:
    """How to install the package of ``module``: the extra of vagent that lists it (pyproject.toml's
    optional dependencies, as installed), else the module's name."""
    import re
    from importlib.metadata import PackageNotFoundError, requires

    try:
        wanted = requires("vagent") or []
    except PackageNotFoundError:
        wanted = []
    name = module.split(".")[0].replace("_", "-").lower()
    for req in wanted:
        found = re.match(r"([A-Za-z0-9_.-]+).*extra == \"([^\"]+)\"", req)
        if found and found.group(2) != "test" and found.group(1).replace("_", "-").lower() == name:
            return f"this command needs it: pip install 'vagent[{found.group(2)}]'"
    return f"this command needs it: install the package that provides {module!r}"


def main(argv: list[str] | None = None) -> int:
    from vagent.numerics import pin_cpu_kernels
    from vagent.omp import apply_wait_settings

    try:  # before anything imports torch: OpenMP's wait policy for the machine's load (vagent/omp.py)
        apply_wait_settings()
    except ValueError as exc:  # an unknown VAGENT_OMP_WAIT
        print(f"error: {exc}", file=sys.stderr)
        return 2
    pin_cpu_kernels()  # before anything imports torch: the same CPU kernels on every AVX2 machine
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # the subcommand's own usage, not the top level's: "vagent train --foo"
        _command_parser(parser, args).error(f"unrecognized arguments: {' '.join(extra)}")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except ImportError as exc:  # an optional dependency a command needs is missing: one line, no traceback
        line = missing_dependency(exc)
        if line is None:  # an import of vagent's own that failed: a bug, its traceback is wanted
            raise
        print(f"error: {line}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
