"""Describing the run config: every field with its type, the default run's value and its doc
(``vagent train --describe``, the field tables of docs/configuration.md), and a config as YAML."""

from __future__ import annotations

import dataclasses
from typing import Any

import yaml

from vagent.config import describe, to_dict
from vagent.runconfig.load import field_class, load_config
from vagent.runconfig.sections import EnvEntry, RunConfig


def describe_rows(cls: type | None = None, prefix: str = "") -> list[tuple[str, str, Any, str, bool]]:
    """(dotted key, type, default, doc, is_section) of every field of the run config, sections
    flattened (``envs`` items as ``envs.N.*``)."""
    cls = cls or RunConfig
    rows = []
    for name, type_name, default, doc in describe(cls):
        section_class = field_class(cls, name)
        if name == "envs":
            rows.append((f"{prefix}envs", "list of EnvEntry", None, doc, True))
            rows += describe_rows(EnvEntry, prefix + "envs.N.")
        elif section_class is not None and dataclasses.is_dataclass(section_class):
            rows.append((f"{prefix}{name}", section_class.__name__, None, doc, True))
            rows += describe_rows(section_class, prefix + name + ".")
        else:
            rows.append((f"{prefix}{name}", type_name, default, doc, False))
    return rows


def default_run_value(key: str) -> Any:
    """The value of dotted ``key`` (as :func:`describe_rows` writes it; ``envs.N.*`` is the first
    entry) in the default run (``vagent train`` with no arguments)."""
    node: Any = _default_run_tree()
    for part in key.split("."):
        node = node[0] if part == "N" else node[part]
    return node


def _default_run_tree() -> dict:
    global _DEFAULT_RUN_TREE
    if _DEFAULT_RUN_TREE is None:
        _DEFAULT_RUN_TREE = to_dict(load_config(None))
    return _DEFAULT_RUN_TREE


_DEFAULT_RUN_TREE: dict | None = None


def _value_cells(key: str, default: Any) -> tuple[Any, Any | None]:
    """(the default run's value, the dataclass default where it differs, else None)."""
    used, plain = default_run_value(key), to_dict(default)
    return used, (None if used == plain else plain)


def describe_all() -> str:
    """Every config field with type, the default run's value (and the class default where it
    differs) and doc (``vagent train --describe``)."""
    lines = []
    for key, type_name, default, doc, section in describe_rows():
        if section:
            lines.append(f"{key}:  # {doc}")
            continue
        used, plain = _value_cells(key, default)
        note = "" if plain is None else f" (class default {plain!r})"
        lines.append(f"{key} ({type_name}) = {used!r}{note}  # {doc}")
    return "\n".join(lines)


def configuration_markdown() -> str:
    """The field tables of docs/configuration.md (tests/recipes/test_config.py keeps it current):
    the default run's value of each field, and the class default where it differs."""
    out: list[str] = []
    header = ["| key | type | default run | meaning |", "|---|---|---|---|"]
    out += ["### top level", ""] + header
    for key, type_name, default, doc, section in describe_rows():
        if section:
            out += ["", f"### `{key}` ({type_name})", "", doc[0].upper() + doc[1:] + ".", ""] + header
        else:
            used, plain = _value_cells(key, default)
            note = "" if plain is None else f" (class default `{plain!r}`)"
            out.append(f"| `{key}` | {type_name} | `{used!r}`{note} | {doc.replace('|', '/')} |")
    return "\n".join(out) + "\n"


def config_to_yaml(cfg: RunConfig) -> str:
    """The resolved config as YAML (the run directory's config.yaml)."""
    return yaml.safe_dump(to_dict(cfg), sort_keys=False, default_flow_style=None, width=100)
