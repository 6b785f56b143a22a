"""What an env config may ask for: bounds on the fields that scale memory or CPU, finite numbers,
and the fields only the operator of an env server may set.

Every config an env is made with passes :func:`check_limits` (``make`` and ``make_config`` call
it), so a local run and the env server refuse the same values with the same
:class:`~vagent.config.ConfigError` (the server answers 422 with its text). The rules:

1. every float in the config (nested in tuples too) is finite;
2. every reward weight (a field named ``reward_*``, or listed in the class's ``reward_fields``)
   has ``|value| <= REWARD_LIMIT``, so sums of rewards cannot overflow to inf;
3. a field named in :data:`DEFAULT_BOUNDS` or in the env class's ``config_bounds`` lies in
   ``[lo, hi]`` (for a tuple of numbers: each item); :class:`Items` bounds a tuple's length and
   the length of each string in it;
4. strings have at most :data:`MAX_STRING` characters and tuples at most :data:`MAX_ITEMS`
   items unless the class bounds them otherwise.

Server-only fields (the env class's ``server_only`` tuple; e.g. ``svg.svg_dir``,
``svg.render_timeout_s``, ``vigorl_search.data``, ``gym.env_kwargs``) name files, modules,
simulator processes or sandbox limits: a client of ``vagent serve-env`` may not set them (422);
the operator sets them when starting the server (``--env-config svg.svg_dir=/data/targets``).
Locally they are ordinary fields. :func:`describe_limits` lists all of this for the docs
(docs/envs.md, "Config limits").
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from vagent.config import ConfigError

#: the largest |reward weight| accepted (rewards are sums of a few weights; 1e6 keeps them far from overflow)
REWARD_LIMIT = 1e6
#: the longest string field accepted unless the env bounds it otherwise
MAX_STRING = 1024
#: the most items of a tuple/list field unless the env bounds it otherwise
MAX_ITEMS = 64


@dataclass(frozen=True)
class Items:
    """A bound on a tuple field: at most ``max_items`` items; string items at most ``max_chars`` long."""

    max_items: int
    max_chars: int = MAX_STRING


#: bounds every env gets for these field names (an env's ``config_bounds`` overrides them)
DEFAULT_BOUNDS: dict[str, tuple[float, float] | Items] = {
    "image_size": (8, 1024),
    "max_steps": (1, 1000),
    "max_turns": (1, 1000),
    "max_actions_per_turn": (1, 1000),
}


def bounds_of(cls: type) -> dict[str, tuple[float, float] | Items]:
    """The bounds of env class ``cls``'s config fields: the defaults, then the class's ``config_bounds``."""
    names = {f.name for f in dataclasses.fields(cls.Config)}
    merged = {k: v for k, v in DEFAULT_BOUNDS.items() if k in names}
    merged.update(getattr(cls, "config_bounds", {}) or {})
    return merged


def server_only_fields(cls: type) -> tuple[str, ...]:
    """The config fields of ``cls`` that only the server operator may set (``cls.server_only``)."""
    return tuple(getattr(cls, "server_only", ()) or ())


def _is_reward(cls: type, name: str) -> bool:
    return name.startswith("reward_") or name in (getattr(cls, "reward_fields", ()) or ())


def _floats(value: Any) -> list[float]:
    if isinstance(value, float):
        return [value]
    if isinstance(value, (tuple, list)):
        return [x for v in value for x in _floats(v)]
    return []


def check_limits(name: str, cfg: Any, cls: type) -> None:
    """Raise ConfigError if ``cfg`` (env ``name``'s resolved config) breaks a rule of the module
    docstring; the message names the field, the bound and the fix."""
    bounds = bounds_of(cls)
    for f in dataclasses.fields(cfg):
        value, where = getattr(cfg, f.name), f"env '{name}' config.{f.name}"
        for x in _floats(value):
            if not math.isfinite(x):
                raise ConfigError(f"{where}: expected a finite number, got {x!r}.")
        if _is_reward(cls, f.name) and isinstance(value, (int, float)) and not isinstance(value, bool):
            if abs(value) > REWARD_LIMIT:
                raise ConfigError(f"{where}: expected a reward weight with |value| <= {REWARD_LIMIT:g} "
                                  f"(the upper bound for every reward field), got {value!r}.")
        bound = bounds.get(f.name)
        if isinstance(bound, Items) or isinstance(value, (str, tuple, list)):
            _check_items(where, value, bound if isinstance(bound, Items) else Items(MAX_ITEMS))
        if isinstance(bound, tuple):
            lo, hi = bound
            items = value if isinstance(value, (tuple, list)) else (value,)
            for x in items:
                if isinstance(x, (int, float)) and not isinstance(x, bool) and not lo <= x <= hi:
                    raise ConfigError(f"{where}: expected {lo:g} <= value <= {hi:g} (the bound of this field: "
                                      f"larger values cost too much memory or CPU), got {value!r}.")


def _check_items(where: str, value: Any, bound: Items) -> None:
    if isinstance(value, str):
        if len(value) > bound.max_chars:
            raise ConfigError(f"{where}: expected at most {bound.max_chars} characters, got {len(value)}.")
        return
    if isinstance(value, (tuple, list)):
        if len(value) > bound.max_items:
            raise ConfigError(f"{where}: expected at most {bound.max_items} items, got {len(value)}.")
        for i, item in enumerate(value):
            if isinstance(item, str) and len(item) > bound.max_chars:
                raise ConfigError(f"{where}[{i}]: expected at most {bound.max_chars} characters, got {len(item)}.")


def describe_limits(cls: type) -> list[tuple[str, str]]:
    """(field, rule) rows of ``cls``'s bounds and server-only fields, for the docs."""
    rows = []
    for field_name, bound in sorted(bounds_of(cls).items()):
        if isinstance(bound, Items):
            rule = f"<= {bound.max_items} items" + (f", each <= {bound.max_chars} chars" if bound.max_chars != MAX_STRING else "")
        else:
            rule = f"{bound[0]:g} .. {bound[1]:g}"
        rows.append((field_name, rule))
    rows += [(f, "server-only") for f in server_only_fields(cls)]
    return rows


__all__ = ["REWARD_LIMIT", "MAX_STRING", "MAX_ITEMS", "Items", "DEFAULT_BOUNDS", "bounds_of", "server_only_fields",
           "check_limits", "describe_limits"]
