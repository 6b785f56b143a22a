"""Loading a run config: a YAML file (or mapping, or the default preset), ``key=value`` overrides
on dotted paths, then :func:`vagent.runconfig.validate.validate` and ``validate_envs``."""

from __future__ import annotations

import copy
import dataclasses
import typing
from pathlib import Path
from typing import Any, Mapping

import yaml

from vagent.config import ConfigError, _suggest, field_types, from_mapping
from vagent.runconfig.presets import default_preset_dict, missing_config_hint
from vagent.runconfig.ranges import read_config_text
from vagent.runconfig.sections import RunConfig
from vagent.runconfig.validate import validate, validate_envs


def parse_override(text: str) -> tuple[list[str], Any]:
    """``"a.b.0.c=value"`` -> (["a", "b", "0", "c"], yaml-parsed value)."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} is not key=value (e.g. ppo.estimator=turn_gae).")
    key, _, raw = text.partition("=")
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {text!r} has an empty key part.")
    try:
        value = load_yaml(raw, f"override {key!r}") if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {text!r}: the value is not valid YAML ({exc}).") from exc
    return key.split("."), value


#: a config file's size and its values once aliases are expanded: a config is a few KB of a few
#: hundred values; a YAML alias bomb (365 bytes) expands to millions
MAX_YAML_BYTES = 1 << 20
MAX_YAML_VALUES = 100_000


def load_yaml(text: str, where: str) -> Any:
    """``yaml.safe_load(text)`` bounded: at most :data:`MAX_YAML_BYTES` of text and
    :data:`MAX_YAML_VALUES` values counted with every alias expanded (ConfigError otherwise)."""
    if len(text.encode("utf-8", "surrogatepass")) > MAX_YAML_BYTES:
        raise ConfigError(f"{where} is larger than {MAX_YAML_BYTES >> 20} MB; a run config is a few KB of key: value "
                          "lines.")
    tree = yaml.safe_load(text)
    count, stack = 0, [tree]
    while stack:
        node = stack.pop()
        count += 1
        if count > MAX_YAML_VALUES:
            raise ConfigError(f"{where} expands to more than {MAX_YAML_VALUES} values (YAML aliases repeated inside "
                              "each other?); write the config without nested aliases.")
        if isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return tree


def tri_state_strings(tree: Any, cls: type | None) -> Any:
    """``tree`` with YAML booleans turned into the strings of tri-state fields: a field typed
    ``Literal["auto", "true", "false"]`` written ``bf16: false`` in a YAML file (a boolean) reads as
    ``"false"``, as it does on the command line."""
    if isinstance(tree, list):
        item = _list_item_class(cls) if cls is not None else None
        return [tri_state_strings(x, item) for x in tree]
    if not isinstance(tree, dict) or cls is None or not dataclasses.is_dataclass(cls):
        return tree
    types = field_types(cls)
    out = {}
    for key, value in tree.items():
        tp = types.get(key)
        if isinstance(value, bool) and typing.get_origin(tp) is typing.Literal and {"true", "false"} <= set(
                typing.get_args(tp)):
            value = "true" if value else "false"
        out[key] = tri_state_strings(value, field_class(cls, key) if typing.get_origin(tp) not in (list, tuple)
                                     else tp)
    return out


def _set_path(tree: dict, path: list[str], value: Any, cls: type | None) -> None:
    """Set ``value`` at ``path`` in a plain-dict config ``tree`` (cls guides unknown-key errors)."""
    node: Any = tree
    where = []
    for i, part in enumerate(path):
        last = i == len(path) - 1
        where.append(part)
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise ConfigError(f"override '{'.'.join(path)}': '{part}' must be an index below {len(node)}.")
            index = int(part)
            if last:
                node[index] = value
                return
            node = node[index]
            cls = _list_item_class(cls)
            continue
        if not isinstance(node, dict):
            raise ConfigError(f"override '{'.'.join(path)}': '{'.'.join(where[:-1])}' is not a section.")
        if cls is not None and dataclasses.is_dataclass(cls):
            names = [f.name for f in dataclasses.fields(cls)]
            if part not in names:
                raise ConfigError(
                    f"override '{'.'.join(path)}': unknown key '{part}' in {cls.__name__}."
                    f"{_suggest(part, names)} Valid keys: {', '.join(names)}."
                )
        if last:
            node[part] = value
            return
        if node.get(part) is None:
            node[part] = {}
        node = node[part]
        cls = field_class(cls, part)


def field_class(cls: type | None, name: str) -> type | None:
    """The dataclass of field ``name`` of config class ``cls`` (a list field: its list type; else None)."""
    if cls is None or not dataclasses.is_dataclass(cls):
        return None
    field_type = field_types(cls).get(name)
    if isinstance(field_type, type) and dataclasses.is_dataclass(field_type):
        return field_type
    if typing.get_origin(field_type) in (list, tuple):
        return field_type  # a list[...] alias: resolved to the item class when indexed
    return None


def _list_item_class(list_type: Any) -> type | None:
    args = typing.get_args(list_type) if list_type is not None else ()
    return args[0] if args and isinstance(args[0], type) and dataclasses.is_dataclass(args[0]) else None


def default_run_name(cfg: RunConfig) -> str:
    """``<env names>-<recipe>``: the name of a run whose config sets none (``corridor-ppo``)."""
    envs = "-".join(dict.fromkeys(str(e.name).replace("/", "_").replace("\\", "_") for e in cfg.envs)) or "run"
    return f"{envs}-{cfg.recipe}"


def load_config(
    source: str | Path | Mapping[str, Any] | None = None, overrides: list[str] | tuple[str, ...] = ()
) -> RunConfig:
    """Build a :class:`RunConfig` from a YAML file (or mapping, or the default preset) plus overrides."""
    if source is None:
        tree = default_preset_dict()
    elif isinstance(source, Mapping):
        tree = copy.deepcopy(dict(source))
    else:
        path = Path(source)
        if not path.is_file():
            raise ConfigError(f"config file {str(path)!r} does not exist.{missing_config_hint(str(path))}")
        try:
            tree = load_yaml(read_config_text(path), str(path)) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML ({exc}).") from exc
        if not isinstance(tree, dict):
            raise ConfigError(f"{path}: expected a mapping of config keys at the top level.")
    for text in overrides:
        keys, value = parse_override(text)
        _set_path(tree, keys, value, RunConfig)
    cfg = from_mapping(RunConfig, tri_state_strings(tree, RunConfig), where="config")
    cfg.name = cfg.name or default_run_name(cfg)
    cfg = validate(cfg)
    if cfg.imports:  # the modules that register the config's own envs, before anything looks them up
        from vagent.plugins import PluginImportError, import_modules

        try:
            import_modules(cfg.imports)
        except PluginImportError as exc:
            raise ConfigError(f"imports: {exc}") from exc
    return validate_envs(cfg)
