"""The config a ``--resume`` continues with, checked against what the run started with.

A new run writes ``run.json`` (its identity: run id, the resolved config, the hash of the fields
that shape its state; :mod:`vagent.runs.identity`) and then ``config.yaml``, each atomically. A
resume reads ``config.yaml`` back and compares every field with ``run.json``:

- an empty or unparseable ``config.yaml`` (a disk that filled while the run directory was made,
  a file emptied by hand) is an error: the run is never continued with the class defaults;
- a field that differs is refused, each one listed (``seed 0 -> 1``), unless it is one that may
  change (:data:`vagent.runs.identity.CHANGEABLE`: ``steps``, ``threads``, ``log.*``, ``val.*``,
  ``hub.*``, ``dist.timeout_s``) and the resume names it as an override
  (``vagent train --resume RUN steps=6``); an accepted change is written to ``config.yaml`` and
  appended to ``run.json``'s ``changes``, so what the console prints is what trains.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Callable, Sequence

import yaml

from vagent.config import ConfigError
from vagent.recipes.config import RunConfig, config_to_yaml, load_config, parse_override
from vagent.recipes.config.ranges import read_config_text
from vagent.runs.identity import (
    CHANGEABLE, IdentityError, RunIdentity, changeable, config_changes, flatten, read_run_identity,
)
from vagent.runs.rundir import RunDir, write_atomic


def flat_config(cfg: RunConfig) -> dict:
    """The resolved config as ``{dotted key: value}``."""
    return flatten(dataclasses.asdict(cfg))


def write_new_run_files(run: RunDir, cfg: RunConfig) -> RunIdentity:
    """``run.json`` then ``config.yaml`` of a new run, each written whole or not at all (a
    directory without config.yaml is not taken for a run by ``--resume``)."""
    identity = RunIdentity.new(flat_config(cfg))
    write_atomic(run.identity, identity.to_json())
    write_atomic(run.config, config_to_yaml(cfg))
    return identity


def _changeable_text() -> str:
    return ", ".join(p + "*" if p.endswith(".") else p for p in CHANGEABLE)


def _saved_tree(path: Path) -> None:
    """ConfigError unless ``path`` holds a non-empty YAML mapping (what vagent wrote)."""
    text = read_config_text(path)
    try:
        tree = yaml.safe_load(text) if text.strip() else None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML ({str(exc).splitlines()[0]}); it was damaged after the run "
                          "wrote it. Restore it (the config the run started with) and resume again.") from exc
    if not isinstance(tree, dict) or not tree:
        what = "empty" if not text.strip() else "not a mapping of config keys"
        raise ConfigError(f"{path} is {what} ({len(text.encode())} bytes): the disk may have been full when the run "
                          "directory was made. Resuming would train the default config under this run's name, so it "
                          "is refused: restore config.yaml (the config the run started with) and resume again.")


def _check_overrides(overrides: Sequence[str]) -> list[str]:
    keys = [".".join(parse_override(o)[0]) for o in overrides]
    fixed = [k for k in keys if not changeable(k)]
    if fixed:
        raise ConfigError(f"--resume overrides may change only {_changeable_text()}; {', '.join(fixed)} shape(s) the "
                          "run's trained state: start a new run to change them.")
    return keys


def resume_config(run: RunDir, overrides: Sequence[str] = (), say: Callable[[str], None] = print,
                  write: bool | None = None) -> tuple[RunConfig, RunIdentity]:
    """The config to resume ``run`` with and the run's identity (see the module doc). ``write``:
    whether this process records a new identity or an accepted change (default: rank 0 of a job,
    or the one process; the other ranks read what it wrote)."""
    write = os.environ.get("RANK", "0") == "0" if write is None else write
    _saved_tree(run.config)
    named = _check_overrides(overrides)
    cfg = load_config(run.config, list(overrides))
    flat = flat_config(cfg)
    try:
        identity = read_run_identity(run.root)
    except IdentityError as exc:
        raise ConfigError(f"{exc}; restore it from a copy of the run directory.") from exc
    if identity is None:  # a run started by an older vagent: its identity starts now
        identity = RunIdentity.new(flat)
        if write:
            write_atomic(run.identity, identity.to_json())
        say(f"note: {run.root} has no run.json (started by an older vagent); its identity is recorded now, and its "
            "checkpoints resume without an identity check")
    changes = config_changes(identity.config, flat)
    if not changes:
        return cfg, identity
    refused = {k: v for k, v in changes.items() if not (changeable(k) and any(k == n or k.startswith(n + ".")
                                                                              for n in named))}
    if refused:
        listed = "; ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in refused.items())
        raise ConfigError(f"{run.config} differs from the config the run started with ({run.identity}): {listed}. "
                          "Restore those values (the ones before the arrows) to resume, or start a new run. Only "
                          f"{_changeable_text()} may change on a resume, named as overrides: "
                          f"vagent train --resume {run.root} steps=N")
    identity = identity.with_change(flat, changes)
    if write:
        write_atomic(run.config, config_to_yaml(cfg))
        write_atomic(run.identity, identity.to_json())
    say("config change accepted on resume (recorded in run.json): "
        + "; ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in changes.items()))
    return cfg, identity
