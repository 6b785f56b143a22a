"""Declared configs: dataclasses whose fields are the only accepted keys.

``from_mapping(Config, {...})`` builds a config from a mapping (YAML, CLI, ``make(**kw)``),
rejecting unknown keys with a "did you mean" and coercing simple types (int/float/bool/str,
tuples and lists of them, nested dataclasses). Every field is documented by a ``#:`` comment or
the dataclass docstring; ``describe(Config)`` lists fields with defaults for ``vagent envs`` and
the docs.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import types
import typing
from typing import Any, Mapping, TypeVar

T = TypeVar("T")


class ConfigError(ValueError):
    """A config value or key is wrong; the message says what was expected and how to fix it."""


def _suggest(key: str, options: list[str]) -> str:
    close = difflib.get_close_matches(key, options, n=1, cutoff=0.6)
    return f" Did you mean '{close[0]}'?" if close else ""


def _coerce_union(value: object, args: tuple[Any, ...], where: str) -> Any:
    """``value`` as the first member type of a union that accepts it (None where the union allows it)."""
    if value is None and type(None) in args:
        return None
    errors = []
    for arg in args:
        if arg is type(None):
            continue
        try:
            return _coerce(value, arg, where)
        except ConfigError as exc:
            errors.append(str(exc))
    raise ConfigError(errors[0] if errors else f"{where}: cannot accept {value!r}")


def _coerce_sequence(value: object, origin: type, args: tuple[Any, ...], where: str) -> list[Any] | tuple[Any, ...]:
    """``value`` (a list or tuple) as ``origin[args]``: a fixed-length tuple, ``tuple[T, ...]`` or ``list[T]``."""
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise ConfigError(f"{where}: expected a list, got {value!r}.")
    if origin is tuple and args and args[-1] is not Ellipsis:
        if len(args) != len(value):
            raise ConfigError(f"{where}: expected {len(args)} items, got {len(value)} ({value!r}).")
        return tuple(_coerce(v, a, f"{where}[{i}]") for i, (v, a) in enumerate(zip(value, args)))
    inner = args[0] if args else Any
    items = [_coerce(v, inner, f"{where}[{i}]") for i, v in enumerate(value)]
    return tuple(items) if origin is tuple else items


def _coerce(value: object, tp: Any, where: str) -> Any:
    """``value`` checked against, and where simple converted to, the annotation ``tp``; ``where`` names it in errors."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        return _coerce_union(value, args, where)
    if origin is typing.Literal:
        if value not in args:
            raise ConfigError(f"{where}: expected one of {list(args)}, got {value!r}.")
        return value
    if origin in (tuple, list):
        return _coerce_sequence(value, origin, args, where)
    if origin is dict or tp is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}.")
        return dict(value)
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a mapping of {tp.__name__} fields, got {value!r}.")
        return from_mapping(tp, value, where=where)
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        raise ConfigError(f"{where}: expected true/false, got {value!r}.")
    if tp is int or tp is float:
        return _number(value, tp, where)
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{where}: expected a string, got {value!r}.")
    return value


def _number(value: object, tp: type, where: str) -> int | float:
    """``value`` as ``tp``: an int from an int, a whole float or a digit string; a float from an int, a
    float or a numeric string; never from a bool."""
    if isinstance(value, str):
        try:
            return tp(value)
        except ValueError:
            pass
    elif isinstance(value, int) and not isinstance(value, bool):
        return value if tp is int else float(value)
    elif isinstance(value, float) and (tp is float or value.is_integer()):
        return tp(value)
    raise ConfigError(f"{where}: expected {'an integer' if tp is int else 'a number'}, got {value!r}.")


def field_types(cls: type) -> dict[str, Any]:
    """Resolved type hints of a dataclass's fields."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints.get(f.name, Any) for f in dataclasses.fields(cls)}


def from_mapping(cls: type[T], values: Mapping[str, Any], where: str | None = None) -> T:
    """Build dataclass ``cls`` from ``values``; unknown keys and bad types raise ConfigError."""
    where = where or cls.__name__
    if not isinstance(values, Mapping):
        raise ConfigError(f"{where}: expected a mapping of fields, got {type(values).__name__}.")
    types_ = field_types(cls)
    names = list(types_)
    unknown = [k for k in values if k not in types_]
    if unknown:
        k = unknown[0]
        raise ConfigError(
            f"{where}: unknown key '{k}'.{_suggest(str(k), names)} Valid keys: {', '.join(names)}."
        )
    kwargs = {k: _coerce(v, types_[k], f"{where}.{k}") for k, v in values.items()}
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise ConfigError(f"{where}: {exc}") from exc


def field_docs(cls: type) -> dict[str, str]:
    """Field documentation from ``#: doc`` comments above each field in the class source."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            lines = inspect.getsource(klass).splitlines()
        except (OSError, TypeError):
            continue
        pending: list[str] = []
        for line in lines:
            s = line.strip()
            if s.startswith("#:"):
                pending.append(s[2:].strip())
            elif pending and ":" in s and not s.startswith(("#", "def ", "@", "class ")):
                docs[s.split(":", 1)[0].strip()] = " ".join(pending)
                pending = []
            elif not s.startswith("#:"):
                pending = []
    return docs


def describe(cls: type) -> list[tuple[str, str, Any, str]]:
    """(name, type, default, doc) for each field of a dataclass config."""
    docs = field_docs(cls)
    out = []
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = "<required>"
        tp = field_types(cls)[f.name]
        out.append((f.name, getattr(tp, "__name__", str(tp)).replace("typing.", ""), default, docs.get(f.name, "")))
    return out


def to_dict(cfg: object) -> dict[str, Any]:
    """A JSON/YAML-able dict of a dataclass config (tuples become lists)."""

    def conv(v: object) -> Any:
        if dataclasses.is_dataclass(v):
            return {f.name: conv(getattr(v, f.name)) for f in dataclasses.fields(v)}
        if isinstance(v, (list, tuple)):
            return [conv(x) for x in v]
        if isinstance(v, dict):
            return {k: conv(x) for k, x in v.items()}
        return v

    return conv(cfg)
