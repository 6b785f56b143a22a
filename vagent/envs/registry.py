"""Registry of environments: ``register`` (one line per env), ``make`` and ``list_envs``.

An env class declares its config as a dataclass in the class attribute ``Config`` (every field
documented with a ``#:`` comment) and takes that config as its only constructor argument.
Built-in envs are registered by import path so that ``import vagent.envs`` stays cheap.
"""

from __future__ import annotations

import difflib
import importlib
from dataclasses import dataclass
from typing import Any, Callable

from vagent.config import from_mapping

_REGISTRY: dict[str, str | type] = {}

#: how an env of one's own becomes known (the end of every "Unknown env" error)
IMPORT_HINT = ("An env of your own is registered when its module is imported: pass --import MODULE (a dotted "
               "module name found from the current folder, or a .py file; `imports: [MODULE]` in a run config), "
               "or import the module in Python before make().")


@dataclass
class EnvConfig:
    """Config fields every built-in env shares (an env's ``Config`` extends it)."""

    #: reasoning format: no_think, free_think, grounding, worldmodeling, grounding_worldmodeling
    format: str = "grounding_worldmodeling"
    #: how state descriptions are written: natural, structured (JSON-like) or symbolic (grid)
    description_style: str = "natural"
    #: observation render: "vision" (an image per observation) or "text" (a text grid, no image)
    render: str = "vision"
    #: the most actions executed from one reply; extra actions are dropped
    max_actions_per_turn: int = 3
    #: reward preset name ("lite" or "paper"); individual reward fields override it
    rewards: str = "lite"


def register(name: str, env: str | type, *, overwrite: bool = False) -> None:
    """Register an env class (or "module:Class" import path) under ``name``."""
    if not overwrite and name in _REGISTRY and _REGISTRY[name] != env:
        raise ValueError(f"An env named '{name}' is already registered; pass overwrite=True to replace it.")
    _REGISTRY[name] = env


def env_class(name: str) -> type[Any]:
    """The class registered under ``name`` (imported on first use)."""
    if name not in _REGISTRY:
        close = difflib.get_close_matches(name, list(_REGISTRY), n=1)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        raise KeyError(f"Unknown env '{name}'.{hint} Registered envs: {', '.join(sorted(_REGISTRY))}. "
                       f"{IMPORT_HINT}")
    entry = _REGISTRY[name]
    if isinstance(entry, str):
        module, _, attr = entry.partition(":")
        entry = getattr(importlib.import_module(module), attr)
        _REGISTRY[name] = entry
    return entry


def make_config(name: str, **config: object) -> Any:
    """Validate ``config`` against env ``name``'s declared Config (unknown keys raise) and its
    limits (:func:`vagent.envs.limits.check_limits`: bounds on memory/CPU, finite numbers)."""
    from vagent.envs.limits import check_limits

    cls = env_class(name)
    cfg = from_mapping(cls.Config, config, where=f"env '{name}' config")
    check_limits(name, cfg, cls)
    return cfg


def make(name: str, **config: object) -> Any:
    """Create env ``name`` with ``config``; unknown names and keys raise errors listing what exists."""
    cls = env_class(name)
    env = cls(make_config(name, **config))
    env.spec_name, env.spec_config = name, dict(config)  # lets the checker rebuild it in a fresh process
    return env


def _is_builtin(entry: str | type) -> bool:
    module = entry.partition(":")[0] if isinstance(entry, str) else entry.__module__
    return module == "vagent" or module.startswith("vagent.")


def list_envs(builtin_only: bool = False) -> list[str]:
    """Names of all registered envs, sorted; ``builtin_only`` keeps those defined in vagent itself
    (not envs that user code or a test registered at run time)."""
    return sorted(n for n, e in _REGISTRY.items() if not builtin_only or _is_builtin(e))


def env_factory(name: str, **config: object) -> Callable[[], Any]:
    """A zero-argument callable that makes the env (validates the config now, not later)."""
    make_config(name, **config)
    return lambda: make(name, **config)
