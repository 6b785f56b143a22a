"""A vagent process's heavy imports, kept out of Python's cyclic garbage collector.

Importing torch, transformers and the recipes leaves ~380,000 objects (modules, classes, functions)
that live as long as the process (a tiny ``vagent train`` run has ~590,000 frozen by its end). Python's collector walks all of them in every full collection: six during
the imports themselves, then at interpreter exit. Both are work for nothing, since none of those
objects is ever garbage. :func:`heavy_imports` runs a block of imports with the collector off and
then moves every object alive (``gc.freeze``) to the permanent generation, which later
collections skip. Results are unchanged: only the collector's scheduling moves.

Where: the ``vagent train`` command (one process, each torchrun rank, the ``--nproc`` launcher)
and ``vagent.recipes.train``, a sweep's trials, ``vagent eval``'s hf models, and the engine replica
actors, which unpickle their model and encoder themselves inside a block
(``vagent.models.replica_actors.Deferred``) and freeze again once built (:func:`freeze_set_up`).
Measured on a 2-core Intel Xeon (load 0.7-1.5), a 1-process tiny ``vagent train`` (2 PPO steps):
6.82 s of CPU without, 5.25 s with (0.77x; ``bench/startup_cpu.py``, docs/results.md "Test suite").

Cost: cyclic garbage alive at a freeze is never collected. A fresh process has almost none when
its imports end; a process that calls vagent's commands in-process (a test suite) freezes only the
first time a block imports anything (later blocks import nothing new and freeze nothing).

The other half of a light start: a package re-exports its modules' names through
:func:`lazy_exports` (``vagent.models``, ``vagent.rollout``, ``vagent.runs``, ``vagent.service``), so
importing one light piece of it (a Ray actor's class module, the CLI) loads none of the heavy ones.
"""

from __future__ import annotations

import gc
import importlib
import sys
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Mapping


@contextmanager
def heavy_imports() -> Iterator[None]:
    """Import inside this block: the collector is off while it runs; if it imported any module,
    every object alive at its end is frozen (``gc.freeze``). The collector's earlier state (on, or
    off by the caller's choice) is restored. Blocks nest: the outer one restores."""
    enabled = gc.isenabled()
    modules = len(sys.modules)
    gc.disable()
    try:
        yield
    finally:
        if len(sys.modules) > modules:
            gc.freeze()
        if enabled:
            gc.enable()


def freeze_set_up() -> None:
    """Freeze every object alive now, once a long-lived process's set-up is done (an engine
    replica's model and engine): they live until it exits."""
    gc.freeze()


def lazy_exports(package: str, where: Mapping[str, str]) -> Callable[[str], Any]:
    """A package's module ``__getattr__`` (PEP 562) for names re-exported from its modules (``where``:
    name -> module path): each loads its module on first use, so importing the package, or one light
    module of it, loads none of the heavy ones."""

    def __getattr__(name: str) -> Any:
        if name in where:
            return getattr(importlib.import_module(where[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
