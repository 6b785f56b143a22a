"""Import a user's own modules (envs that call ``register``) before a command looks up env names.

Every command that takes an env (``vagent train / play / envs / demos / eval / serve-env``) has
``--import MODULE`` (repeatable), and a run config has ``imports: [package.module, ...]``; both
end here. A MODULE is a dotted module name, importable from ``sys.path`` (the current directory
is put first, as ``python -m`` does), or the path of a ``.py`` file::

    vagent envs corridor --import corridor          # ./corridor.py or an installed module
    vagent play corridor --import ./envs/corridor.py --policy solver
    vagent train --config my_run.yaml               # with imports: [mypackage.corridor]

Importing is all that happens: the module's ``register("corridor", "corridor:CorridorEnv")``
line makes the env known. A module that cannot be found raises :class:`PluginImportError`
naming the module, the directories searched and the fix.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import Iterable


def add_import_argument(parser: argparse.ArgumentParser, also: str = "") -> None:
    """The ``--import MODULE`` option (repeatable, into ``args.imports``) of a command that takes an
    env: modules to import first, so that the envs they ``register`` are known (docs/custom_env.md).
    ``also`` is said in its help before "repeatable" (where else the modules go)."""
    parser.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                        help="module to import first, which registers your own envs: a dotted name (found from the "
                             f"current folder or sys.path) or a .py file; {also}repeatable")


class PluginImportError(ImportError):
    """A module named by ``--import`` / ``imports:`` could not be imported."""


def import_modules(modules: Iterable[str]) -> list[str]:
    """Import each module (dotted name or ``.py`` path), in order; returns their module names.

    Dotted names are looked up with the current working directory on ``sys.path`` (added once,
    first). A ``.py`` file is imported under its stem (``envs/corridor.py`` -> ``corridor``) with
    its directory on ``sys.path``, so ``register("corridor", "corridor:CorridorEnv")`` in it
    resolves in this and in any fresh process that repeats the import.
    """
    names = []
    for mod in modules:
        mod = str(mod).strip()
        if not mod:
            continue
        names.append(_import_one(mod))
    return names


def _import_one(mod: str) -> str:
    if mod.endswith(".py"):
        path = Path(mod).expanduser().resolve()
        if not path.is_file():
            raise PluginImportError(f"import {mod!r}: no such file ({path}). Pass an existing .py file or "
                                    "a dotted module name.")
        _prepend_path(str(path.parent))
        name = path.stem
        loaded = sys.modules.get(name)
        if loaded is not None and Path(getattr(loaded, "__file__", "") or "").resolve() != path:
            raise PluginImportError(f"import {mod!r}: a different module named {name!r} is already imported "
                                    f"({loaded.__file__}); rename the file.")
        importlib.import_module(name)
        return name
    _prepend_path(os.getcwd())
    try:
        importlib.import_module(mod)
    except ModuleNotFoundError as exc:
        if exc.name is None or not (mod == exc.name or mod.startswith(exc.name + ".")):
            raise  # the module exists but imports something missing: show that error as is
        raise PluginImportError(
            f"import {mod!r}: no module named {exc.name!r} (searched the current directory {os.getcwd()} and "
            f"sys.path). Run from the directory that holds it, install its package (pip install -e .), set "
            f"PYTHONPATH, or pass the path of its .py file."
        ) from exc
    return mod


def _prepend_path(directory: str) -> None:
    if directory not in sys.path:
        sys.path.insert(0, directory)
