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
  appended to ``run.json``'s ``changes``, so what the console prints is what trains;
- a run whose ``run.json`` is gone is the run its checkpoints name: their ``identity.json`` files
  must agree with each other (run id, state hash) and with ``config.yaml`` (the hash of its
  state-shaping fields), and the identity is rebuilt from them; when they disagree the resume is
  refused, saying so. A run whose checkpoints have no ``identity.json`` (an older vagent's) gets an
  identity now, and its checkpoints resume without an identity check.

:func:`resume_config` only reads: what it would write (``run.json``, ``config.yaml``) waits in the
returned :class:`Resume` until :meth:`Resume.accept`, which ``train`` calls once the checkpoint to
resume from is chosen and accepted (``vagent.recipes.run``): a refused resume writes nothing.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import yaml

from vagent.config import ConfigError
from vagent.runconfig import RunConfig, config_to_yaml, load_config, parse_override
from vagent.runconfig.ranges import read_config_text
from vagent.recipes.consent import CodeConsent, check_run_code
from vagent.runs.checkpoint import CheckpointError, CheckpointInfo, list_checkpoints
from vagent.runs.identity import (
    CHANGEABLE, IdentityError, RunIdentity, changeable, config_changes, flatten, read_checkpoint_identity,
    read_run_identity, state_hash,
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


@dataclass(frozen=True)
class Resume:
    """What a ``--resume`` continues with, before anything is written (see the module doc)."""

    #: the config to train with (config.yaml plus the accepted overrides)
    cfg: RunConfig
    #: the run's identity (from run.json, rebuilt from the checkpoints, or new)
    identity: RunIdentity
    #: whether the checkpoints are checked against ``identity`` (False: none of them has one)
    checks_identity: bool = True
    #: lines for the console once the resume is accepted
    said: tuple[str, ...] = ()
    #: (path, text) of the files the resume writes once accepted: run.json, config.yaml
    pending: tuple[tuple[Path, str], ...] = ()
    #: the overrides the resume was given (``steps=6``)
    overrides: tuple[str, ...] = ()

    def accept(self) -> None:
        """Write the pending files, each whole or not at all (rank 0 of a job, or the one process;
        the other ranks hold the same :class:`Resume`)."""
        for path, text in self.pending:
            write_atomic(path, text)


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


def resume_config(run: RunDir, overrides: Sequence[str] = (), consent: CodeConsent = CodeConsent()) -> Resume:
    """The config to resume ``run`` with and the run's identity (see the module doc); reads only.
    ConfigError names what is refused: a damaged config.yaml or run.json, code the config names
    that ``consent`` does not (:func:`check_run_code`), a changed field, an override of a field
    that may not change, checkpoints that disagree on whose they are."""
    _saved_tree(run.config)
    check_run_code(run.config, consent)  # before load_config, which imports the config's modules
    named = _check_overrides(overrides)
    cfg = load_config(run.config, list(overrides))
    flat = flat_config(cfg)
    try:
        identity = read_run_identity(run.root)
    except IdentityError as exc:
        raise ConfigError(f"{exc}; restore it from a copy of the run directory.") from exc
    checks, said, pending = True, [], []
    if identity is None:  # lost, or a run started by an older vagent: its checkpoints say whose they are
        identity, checks, note = _identity_from_checkpoints(run)
        said.append(note)
        pending.append((run.identity, identity.to_json()))
    changes = config_changes(identity.config, flat)
    if changes:
        _refuse_unnamed(run, changes, named)
        identity = identity.with_change(flat, changes)
        pending = [(run.config, config_to_yaml(cfg)), (run.identity, identity.to_json())]
        said.append("config change accepted on resume (recorded in run.json): "
                    + "; ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in changes.items()))
    return Resume(cfg, identity, checks, tuple(said), tuple(pending), tuple(overrides))


def check_resumable(run: RunDir, latest: CheckpointInfo | None, plan: Resume, ranks: int) -> None:
    """Whether a job of ``ranks`` processes can continue ``run`` from checkpoint ``latest`` with
    ``plan``'s config: CheckpointError for one written by one process (no ``dcp/`` folder: one
    process loads it) in a job of several; ConfigError when ``steps`` is below the RL step it holds
    (the run has trained more, and config.yaml would disagree with it)."""
    if latest is None:
        return
    if ranks > 1 and not (latest.path / "dcp").is_dir():
        command = " ".join(["vagent train --resume", str(run.root), *plan.overrides])
        raise CheckpointError(f"checkpoint {latest.path} was written by one process (it has no dcp/ folder), and a "
                              f"job of {ranks} processes cannot load it: resume it with one process, {command} "
                              "(without --nproc/--nnodes).")
    if latest.phase == "rl" and plan.cfg.steps < latest.step:
        raise ConfigError(f"steps={plan.cfg.steps} is below the {latest.step} RL steps that checkpoint "
                          f"{latest.path.name} holds; config.yaml would then disagree with what was trained. Set "
                          f"steps >= {latest.step}: vagent train --resume {run.root} steps={latest.step} finishes the "
                          "run where it is.")


def _refuse_unnamed(run: RunDir, changes: dict, named: list[str]) -> None:
    """ConfigError listing each changed field that may not change or was not named as an override."""
    refused = {k: v for k, v in changes.items()
               if not (changeable(k) and any(k == n or k.startswith(n + ".") for n in named))}
    if refused:
        listed = "; ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in refused.items())
        raise ConfigError(f"{run.config} differs from the config the run started with ({run.identity}): {listed}. "
                          "Restore those values (the ones before the arrows) to resume, or start a new run. Only "
                          f"{_changeable_text()} may change on a resume, named as overrides: "
                          f"vagent train --resume {run.root} steps=N")


def _identity_from_checkpoints(run: RunDir) -> tuple[RunIdentity, bool, str]:
    """(identity, whether the checkpoints are checked against it, the console's note) of a run
    without run.json: rebuilt from its checkpoints' identity.json files, which must agree with each
    other and with config.yaml as saved (before overrides); new when none of them has one (an older
    vagent's checkpoints, or none yet). ConfigError says which checkpoints disagree and with what."""
    saved = flat_config(load_config(run.config))
    found = list_checkpoints(run.checkpoints)
    named: dict[tuple[str, str], list[str]] = {}
    for c in found:
        ident, _ = read_checkpoint_identity(c.path)  # an unreadable one is skipped by the checkpoint checks
        if ident is not None:
            named.setdefault((ident["run_id"], ident["state_hash"]), []).append(c.path.name)
    if not named:
        what = (f"none of its {len(found)} checkpoint(s) has a readable identity.json (a vagent before identities "
                "wrote none): run.json records them as the run's, and they resume checked by their state.pt step"
                if found else "it has no checkpoint yet")
        # the checkpoints there now are adopted by name: a later resume (after this one was killed before its first
        # checkpoint) still accepts them, while a checkpoint that loses its identity.json later is refused
        return (RunIdentity.new(saved, tuple(c.path.name for c in found)), True,
                f"note: {run.identity} is missing and {what}; the run's identity is recorded from config.yaml")
    if len(named) > 1:
        listed = "; ".join(f"run id {rid[:12]} (state hash {h}): {', '.join(names)}"
                           for (rid, h), names in named.items())
        raise ConfigError(f"{run.identity} is missing and the run's checkpoints disagree on whose they are: {listed}. "
                          "Which of them are this run's cannot be told without run.json: restore it from a copy of "
                          f"the run directory, or move the checkpoints of the other run out of {run.checkpoints}.")
    ((run_id, hashed), names), = named.items()
    if hashed != state_hash(saved):
        raise ConfigError(f"{run.identity} is missing and {run.config} is not the config the run's checkpoints were "
                          f"trained under (their state hash {hashed}, config.yaml's {state_hash(saved)}): a field that "
                          "shapes the trained state was edited. Restore config.yaml (or run.json) from a copy of the "
                          "run directory to resume.")
    return (RunIdentity(run_id, hashed, saved), True,
            f"note: {run.identity} is missing; the run's identity (run id {run_id[:12]}) is rebuilt from the "
            f"identity.json of its checkpoints {', '.join(names)}, which agree with each other and with config.yaml")
