"""A run's identity: which run a checkpoint belongs to, under which config, at which step.

``run.json`` in the run directory is written once, when the run starts (atomically, next to
``config.yaml``)::

    {"version": 1, "run_id": "3f9c...", "created": 1712345678.9, "state_hash": "a41b...",
     "config": {"model.tiny_hidden": 64, "steps": 4, ...},   # the resolved config, flattened
     "changes": [{"time": ..., "fields": {"steps": [4, 6]}}]}  # changes accepted on --resume

``state_hash`` hashes the fields that shape the trained state (:func:`shapes_state`: the model,
the recipe, the estimators, the seed, the envs and every size); ``config`` lets a resume name each
field that differs from what the run started with. Every checkpoint folder holds
``identity.json`` (listed in its manifest like every file)::

    {"run_id": "3f9c...", "state_hash": "a41b...", "phase": "rl", "step": 2,
     "trained_from": {"checkpoint": "sft_000002", "policy_sha256": "..."},   # RL only, after SFT
     "run_files": {"canary_probe.pt": "<sha256>"}}   # the run-level files a resume reads (RUN_FILES)

``trained_from`` names the SFT checkpoint whose policy the RL steps started from (their KL
reference and the critic's first backbone): a resume uses that one, and when it is gone or damaged
the RL checkpoints fall back with it (:func:`vagent.runs.checkpoint.select_checkpoint`).
``run_files`` holds the SHA-256 of each file of :data:`RUN_FILES` that existed when the checkpoint
was written: a resume from it refuses a run-level file that changed or went missing since (a probe
emptied by hand would switch the weight canary off without a word). A checkpoint of a run with
``run.json`` always has ``identity.json``; one without is refused there (only a checkpoint saved
outside a run directory has none).
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from vagent.runs.manifest import file_sha256

RUN_FILE = "run.json"
CHECKPOINT_FILE = "identity.json"
#: files at a run directory's root that a resume reads and each checkpoint's identity records the
#: SHA-256 of: the weight canary's probe (vagent.rollout.canary.PROBE_FILE)
RUN_FILES = ("canary_probe.pt",)

#: config fields that may change on ``--resume`` when the user names them (``key=value``):
#: how long the run goes on, what it logs, where it uploads, how many threads; never what shapes the state
CHANGEABLE = ("steps", "threads", "log.", "val.", "hub.", "dist.timeout_s", "rollout.push_timeout_s",
              "rollout.generate_timeout_s")
#: fields that do not shape the trained state (excluded from the state hash)
_NOT_STATE = CHANGEABLE + ("name", "out_dir", "device", "imports", "dist.", "model.cache_dir", "rollout.replicas",
                           "rollout.replica_threads", "rollout.engine", "rollout.vllm_gpu_memory")


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}, "c": [{"d": 2}]}`` -> ``{"a.b": 1, "c.0.d": 2}`` (an empty dict or list is a value)."""
    if isinstance(tree, Mapping) and tree:
        out: dict[str, Any] = {}
        for k, v in tree.items():
            out.update(flatten(v, f"{prefix}{k}."))
        return out
    if isinstance(tree, (list, tuple)) and tree and any(isinstance(x, Mapping) for x in tree):
        out = {}
        for i, v in enumerate(tree):
            out.update(flatten(v, f"{prefix}{i}."))
        return out
    return {prefix[:-1]: list(tree) if isinstance(tree, tuple) else tree}


def _matches(key: str, prefixes: tuple[str, ...]) -> bool:
    return any(key == p or (p.endswith(".") and key.startswith(p)) for p in prefixes)


def changeable(key: str) -> bool:
    """Whether config field ``key`` (dotted) may change on a resume when named as an override."""
    return _matches(key, CHANGEABLE)


def shapes_state(key: str) -> bool:
    """Whether config field ``key`` shapes the trained state (the model, recipe, estimators, seed,
    envs, sizes, learning rates): everything but what :data:`CHANGEABLE` and the placement fields name."""
    return not _matches(key, _NOT_STATE) and not key.endswith(".urls") and not key.endswith(".token")


def state_hash(flat: Mapping[str, Any]) -> str:
    """SHA-256 (16 hex digits) of the state-shaping fields of a flattened config."""
    fields = {k: v for k, v in sorted(flat.items()) if shapes_state(k)}
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=repr).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class RunIdentity:
    """What ``run.json`` holds (see the module doc)."""

    run_id: str
    state_hash: str
    config: dict[str, Any]
    changes: tuple[dict, ...] = ()
    #: checkpoint folders without identity.json that the run had when its identity was first
    #: recorded (an older vagent's run): the only ones a run with run.json accepts without one
    adopted: tuple[str, ...] = ()

    @staticmethod
    def new(flat: Mapping[str, Any], adopted: tuple[str, ...] = ()) -> "RunIdentity":
        return RunIdentity(uuid.uuid4().hex, state_hash(flat), dict(flat), adopted=tuple(adopted))

    def to_json(self) -> str:
        d = {"version": 1, "run_id": self.run_id, "created": time.time(), "state_hash": self.state_hash,
             "config": self.config, "changes": list(self.changes)}
        if self.adopted:
            d["adopted"] = list(self.adopted)
        return json.dumps(d, indent=1, default=repr) + "\n"

    def with_change(self, flat: Mapping[str, Any], fields: Mapping[str, tuple[Any, Any]]) -> "RunIdentity":
        """The identity after accepting ``fields`` ({key: (old, new)}) on a resume."""
        change = {"time": round(time.time(), 3), "fields": {k: list(v) for k, v in fields.items()}}
        return RunIdentity(self.run_id, state_hash(flat), dict(flat), (*self.changes, change), self.adopted)


class IdentityError(ValueError):
    """``run.json`` is unreadable or not of its schema."""


def read_run_identity(root: str | Path) -> RunIdentity | None:
    """The identity in ``<root>/run.json``; None when the run has none (started by an older vagent).
    A file of another shape raises :class:`IdentityError`."""
    path = Path(root) / RUN_FILE
    if not path.is_file():
        return None
    try:
        d = json.loads(path.read_text())
        ok = (isinstance(d, dict) and isinstance(d.get("run_id"), str) and isinstance(d.get("state_hash"), str)
              and isinstance(d.get("config"), dict) and isinstance(d.get("changes", []), list))
    except (OSError, ValueError, RecursionError) as exc:
        raise IdentityError(f"{path} is unreadable ({type(exc).__name__}: {str(exc)[:100]})") from exc
    if not ok:
        raise IdentityError(f'{path} is not a run identity ({{"run_id", "state_hash", "config", "changes"}})')
    adopted = d.get("adopted", [])
    if not (isinstance(adopted, list) and all(isinstance(x, str) for x in adopted)):
        raise IdentityError(f'{path}: "adopted" is not a list of checkpoint folder names')
    return RunIdentity(d["run_id"], d["state_hash"], d["config"], tuple(d.get("changes", [])), tuple(adopted))


def config_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """Each field whose value differs between two flattened configs: {key: (old, new)}; a field
    present in one only has ``None`` on the other side."""
    keys = sorted(set(old) | set(new))
    return {k: (old.get(k), new.get(k)) for k in keys if _canonical(old.get(k)) != _canonical(new.get(k))}


def _canonical(v: Any) -> str:
    return json.dumps(v, sort_keys=True, default=repr)


def checkpoint_identity(run: RunIdentity, phase: str, step: int, trained_from: dict | None,
                        run_files: Mapping[str, str] | None = None) -> dict:
    """The content of a checkpoint's ``identity.json``; ``run_files``: {name: SHA-256} of the
    :data:`RUN_FILES` that exist."""
    out: dict[str, Any] = {"run_id": run.run_id, "state_hash": run.state_hash, "phase": phase, "step": int(step)}
    if trained_from is not None:
        out["trained_from"] = trained_from
    if run_files:
        out["run_files"] = dict(run_files)
    return out


def read_checkpoint_identity(folder: Path) -> tuple[dict | None, str | None]:
    """``(identity, None)``, ``(None, None)`` when the checkpoint has no identity.json (written
    before identities or outside a run directory), or ``(None, problem)`` for a wrong shape."""
    path = folder / CHECKPOINT_FILE
    if not path.is_file():
        return None, None
    try:
        d = json.loads(path.read_bytes()[:1 << 20])
    except (OSError, ValueError, RecursionError) as exc:
        return None, f"{CHECKPOINT_FILE} is unreadable ({type(exc).__name__})"
    tf = d.get("trained_from") if isinstance(d, dict) else None
    rf = d.get("run_files", {}) if isinstance(d, dict) else None
    if not (isinstance(d, dict) and isinstance(d.get("run_id"), str) and isinstance(d.get("state_hash"), str)
            and d.get("phase") in ("sft", "rl") and type(d.get("step")) is int
            and (tf is None or (isinstance(tf, dict) and isinstance(tf.get("checkpoint"), str)
                                and isinstance(tf.get("policy_sha256"), str)))):
        return None, f'{CHECKPOINT_FILE} is not of the shape {{"run_id", "state_hash", "phase", "step"}}'
    if not (isinstance(rf, dict) and all(k in RUN_FILES and isinstance(v, str) for k, v in rf.items())):
        return None, f'{CHECKPOINT_FILE}: "run_files" is not {{name in {list(RUN_FILES)}: sha256}}'
    return d, None


def in_flight_problem(saved: Any, step: int, run_id: str | None) -> str | None:
    """None when ``saved`` (an ``inflight.pt`` record, ``vagent.rollout.driver.InFlight``) is the
    rollout of the resume's first step: ``step`` updates done (its RL step ``step + 1``), sampled
    with weights no newer, by run ``run_id`` (checked when both name a run: an older vagent's
    record names none); else why not, starting ``inflight.pt ...``. A streaming run's checkpoint
    holds a list of them, the rollouts of steps ``step``, ``step + 1``, ... (each checked so)."""
    if isinstance(saved, list):
        if not saved:
            return "inflight.pt holds an empty list, not the in-flight rollouts vagent saves"
        return next((p for i, rec in enumerate(saved) if (p := in_flight_problem(rec, step + i, run_id)) is not None),
                    None)
    held, version, owner = (getattr(saved, k, None) for k in ("step", "version", "run_id"))
    if type(held) is not int or type(version) is not int:
        return f"inflight.pt holds a {type(saved).__name__}, not the in-flight rollout vagent saves"
    if held != step or version > held:
        return (f"inflight.pt holds the rollout of RL step {held + 1} sampled with weights {version}, not the one a "
                f"resume from step {step} starts with (RL step {step + 1}): copied in from another checkpoint")
    if run_id is not None and owner is not None and owner != run_id:
        return (f"inflight.pt belongs to another run (run id {str(owner)[:12]}, this run's is {run_id[:12]}): copied "
                "in from another run directory")
    return None


def run_files_problem(path: str | Path) -> str | None:
    """None when every run-level file that checkpoint ``path``'s identity recorded (``run_files``:
    the canary's probe) is at the run's root with the recorded SHA-256; else one line naming the
    file, the checkpoint and the fix."""
    p = Path(path)
    ident, _ = read_checkpoint_identity(p)
    for name, digest in ((ident or {}).get("run_files") or {}).items():
        problem = run_file_problem(p.parent.parent / name, digest, p.name)
        if problem is not None:
            return problem
    return None


def run_file_problem(f: Path, digest: str, recorded_by: str) -> str | None:
    """None when run-level file ``f`` has SHA-256 ``digest`` (as checkpoint ``recorded_by``
    recorded it); else one line naming the file and the fix."""
    if not f.is_file():
        return (f"{f} is missing, but checkpoint {recorded_by} recorded it (SHA-256 {digest[:16]}...) and the resume "
                "reads it: restore it from a copy of the run directory")
    if file_sha256(f) != digest:
        return (f"{f} is not the file checkpoint {recorded_by} recorded (SHA-256 {digest[:16]}...): it was changed "
                "after the run wrote it; restore it from a copy of the run directory")
    return None
