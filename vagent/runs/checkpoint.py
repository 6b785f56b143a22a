"""Checkpoints that resume a run exactly: weights, optimizers, schedulers, RNG states, position.

A checkpoint is a folder ``checkpoints/step_<step>`` (or ``sft_<step>`` during an SFT phase)::

    state.pt     {"phase", "step", "data_position", "rng", "optimizers", "schedulers", "extra"}
    <name>.pt    a state_dict per module (policy, critic, ...) - exact for resuming
    <object>.pt  an object the recipe saves beside them (``objects=``; e.g. ``inflight.pt``, the
                 rollout an overlapped run had in flight: :func:`load_object`)
    policy/      the policy saved with save_pretrained + its tokenizer files (for eval / inference)

    manifest.json  every file's size and SHA-256, written last (vagent.runs.manifest)

It is written to a hidden temporary folder ``.tmp-<name>-<pid>`` and renamed into place, so a
process killed while saving (SIGKILL included) leaves the previous checkpoints intact and never a
half-written one; the next save or resume deletes such a leftover folder once its writer is gone
(:func:`vagent.runs.manifest.remove_stale_temporaries`). A save that runs out of disk space deletes
its temporary folder and raises :class:`vagent.runs.errors.DiskFullError` (one line: the path and
the free space).

Loading checks the manifest first (every file's size and hash), then the state's schema; a
damaged checkpoint raises :class:`CheckpointError` naming the file and the intact checkpoints
beside it, and :func:`select_checkpoint` (what ``--resume`` uses) falls back to the newest intact
one, saying which file failed. A checkpoint without a manifest (written by vagent before
manifests) loads with a warning that it is unverified, after a CRC check of its ``.pt`` files.
Nothing in a checkpoint is unpickled as code: every file is read weights-only, with vagent's own
record types allowed where a file holds them (:mod:`vagent.runs.safe_load`), and a file that
names any other global is refused with its name and the global, as damage is; the RNG states are
saved as tensors and plain numbers.
After a save, all but the newest ``keep_last`` checkpoints OF THAT PHASE are deleted, so the end of
the SFT warm start (the policy RL started from) is never pruned by RL's checkpoints.

``step`` is the number of steps completed in ``phase``: resuming from it runs step ``step`` next.

A job of several ranks (torchrun) writes the sharded layout instead (:func:`_save_sharded`)::

    state.pt         as above (rank 0) with "world_size" and "format": "dcp", optimizers in dcp/
    dcp/             torch.distributed.checkpoint: every module's and optimizer's state, each
                     rank writing its shards (``.metadata`` + ``__<rank>_0.distcp``)
    rng_rank<r>.pt   rank r's RNG states
    policy/          the full policy (gathered; rank 0 writes it) for eval / from_pretrained

A sharded checkpoint resumes with any number of ranks, one included (DCP re-shards on load); a
one-process checkpoint resumes in one process.

This module saves and loads; the checks (:func:`check_checkpoint`, :class:`CheckpointError`,
:func:`list_checkpoints`) are in :mod:`vagent.runs.checkpoint_check`, the choice of the checkpoint
a resume starts from (:func:`select_checkpoint`) in :mod:`vagent.runs.checkpoint_select`; their
names are importable from here too.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import torch

from vagent.runs.checkpoint_check import (
    PHASES, CheckpointError, check_checkpoint, damaged_message, first_line, list_checkpoints, read_state,
)
from vagent.runs.dcp_state import module_of, sharded_state
from vagent.runs.errors import DiskFullError, is_disk_full
from vagent.runs.identity import CHECKPOINT_FILE, RUN_FILES, IdentityError, checkpoint_identity, read_run_identity
from vagent.runs.manifest import (
    MANIFEST, WriterLock, file_sha256, read_manifest, remove_stale_temporaries, replace_folder, write_manifest,
)
from vagent.runs.rng import capture_rng, restore_rng
from vagent.runs.safe_load import LEGACY_RNG, RECORDS, UnsafeFileError, data_problem, load_data, load_dcp

# importable from here as before: the checks, the choice of the checkpoint a resume starts from, and
# what this module imported from its neighbours
from vagent.runs.checkpoint_check import STATE_KEYS, _VERIFIED, CheckpointInfo, is_verified  # noqa: F401
from vagent.runs.checkpoint_select import (  # noqa: F401
    identity_problem, recorded_run_file, select_checkpoint, trained_from,
)
from vagent.runs.errors import TrainingError  # noqa: F401
from vagent.runs.identity import (  # noqa: F401
    RunIdentity, in_flight_problem, read_checkpoint_identity, run_file_problem, run_files_problem,
)
from vagent.runs.manifest import check_zip_files, fsync_dir, verify_manifest  # noqa: F401
from vagent.runs.safe_load import load_pickle_data  # noqa: F401


def _folder_name(phase: str, step: int) -> str:
    if phase not in PHASES:
        raise ValueError(f"checkpoint phase must be one of {PHASES}, got {phase!r}")
    return f"{'sft' if phase == 'sft' else 'step'}_{step:06d}"


def save_checkpoint(
    ckpt_dir: str | Path,
    phase: str,
    step: int,
    modules: Mapping[str, torch.nn.Module],
    optimizers: Mapping[str, torch.optim.Optimizer] = {},
    schedulers: Mapping[str, Any] = {},
    data_position: Any = None,
    extra: Mapping[str, Any] | None = None,
    export: Callable[[Path], None] | None = None,
    keep_last: int = 2,
    objects: Mapping[str, Any] | None = None,
) -> Path:
    """Write a checkpoint atomically and prune old ones; returns its folder. ``objects``: picklable
    objects saved as ``<name>.pt`` beside the modules (read back with :func:`load_object`; in a
    job, rank 0's are written)."""
    from vagent.distributed import world

    objects = _checked_objects(objects, modules)
    if world().distributed:
        return _save_sharded(Path(ckpt_dir), phase, step, modules, optimizers, schedulers, data_position,
                             extra, export, keep_last, objects)
    d = Path(ckpt_dir)
    final = d / _folder_name(phase, step)
    tmp = d / f".tmp-{final.name}-{os.getpid()}"
    with _writing(tmp, final) as lock:
        for name, module in modules.items():
            _save(module.state_dict(), tmp / f"{name}.pt")
        state = {
            "phase": phase,
            "step": int(step),
            "data_position": data_position,
            "rng": capture_rng(),
            "optimizers": {k: o.state_dict() for k, o in optimizers.items()},
            "schedulers": {k: s.state_dict() for k, s in schedulers.items()},
            "extra": dict(extra or {}),
        }
        if export is not None:
            export(tmp / "policy")
        for name, obj in objects.items():
            _save_object(obj, tmp / f"{name}.pt")
        _save(state, tmp / "state.pt")
        _write_identity(tmp, d, phase, step)
        write_manifest(tmp)  # the commit point: last, after every file is on disk
        lock.unlink()
        _publish(tmp, final, d, phase, keep_last)
    return final


#: file stems a checkpoint uses itself (an object saved under one of them would overwrite it)
_RESERVED = ("state", "manifest", "identity", "policy", "dcp")


def _checked_objects(objects: Mapping[str, Any] | None, modules: Mapping[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in (objects or {}).items() if v is not None}
    for name in out:
        if not re.fullmatch(r"[a-z][a-z0-9_]*", name) or name in _RESERVED or name in modules or name.startswith("rng"):
            raise ValueError(f"checkpoint object name {name!r} must be a lowercase identifier that is not a module "
                             f"({sorted(modules)}) or one of {_RESERVED} / rng*")
    return out


def load_object(path: str | Path, name: str) -> Any:
    """The object ``save_checkpoint(objects={name: ...})`` saved in checkpoint ``path``, or None
    when it has none (a checkpoint written without it). Read as data: tensors, plain data and the
    classes of :data:`vagent.runs.safe_load.RECORDS` (vagent's rollout records, PIL images, numpy
    arrays); a file that needs another global, or cannot be read, is a CheckpointError naming it.
    The caller has verified the checkpoint (``load_checkpoint`` checks its manifest)."""
    f = Path(path) / f"{name}.pt"
    if not f.is_file():
        return None
    out: list[Any] = []
    _load_into(f, lambda: out.append(load_data(f, RECORDS)))
    return out[0]


def _save(obj: Any, path: Path) -> None:
    """torch.save through a Python file, so a full disk surfaces as OSError(ENOSPC) in the chain."""
    with open(path, "wb") as f:
        torch.save(obj, f)


def _save_object(obj: Any, path: Path) -> None:
    """Save an object beside the modules; ValueError (before the checkpoint is in place) when it
    holds a type that :func:`load_object` would refuse to read back."""
    _save(obj, path)
    problem = data_problem(path, RECORDS)
    if problem is not None:
        raise ValueError(f"checkpoint object {path.stem!r} cannot be saved so that a resume reads it: {problem}. "
                         "An object saved in a checkpoint holds tensors, plain data (numbers, strings, lists, "
                         "dicts), numpy arrays, PIL images and vagent's rollout records only; keep an env's info and "
                         "state to those types.")


@contextmanager
def _writing(tmp: Path, final: Path) -> Iterator[WriterLock]:
    """A fresh temporary folder ``tmp`` held by this process's writer lock; stale temporary folders
    of dead writers are removed first. On any error ``tmp`` is deleted (earlier checkpoints stay
    as they were) and a full disk becomes :class:`DiskFullError`."""
    d = tmp.parent
    d.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(d)
    if tmp.exists():
        shutil.rmtree(tmp)
    lock = None
    try:
        tmp.mkdir()
        lock = WriterLock(tmp)
        yield lock
    except BaseException as exc:
        full = (exc if isinstance(exc, DiskFullError) else DiskFullError(final, what="checkpoint")) \
            if is_disk_full(exc) else None
        shutil.rmtree(tmp, ignore_errors=True)
        if full is not None:
            raise full from exc
        raise
    finally:
        if lock is not None:
            lock.release()


def _publish(tmp: Path, final: Path, d: Path, phase: str, keep_last: int) -> None:
    """Move a complete checkpoint folder into place atomically (a folder of the same step, e.g. a
    damaged one, is moved aside first and removed after: :func:`vagent.runs.manifest.replace_folder`),
    then keep the newest ``keep_last`` checkpoints of ``phase``."""
    replace_folder(tmp, final)
    for old in [c for c in list_checkpoints(d) if c.phase == phase][:-keep_last]:
        shutil.rmtree(old.path, ignore_errors=True)


def _write_identity(tmp: Path, d: Path, phase: str, step: int) -> None:
    """``identity.json`` of a checkpoint written into a run directory (``d`` = ``<run>/checkpoints``
    whose ``run.json`` names the run); nothing outside one. An RL checkpoint names the SFT
    checkpoint it trained from: the newest one in ``d`` (SFT always checkpoints its last step,
    which RL starts from). The SHA-256 of each run-level file a resume reads
    (:data:`vagent.runs.identity.RUN_FILES`: the canary's probe) that exists is recorded too."""
    try:
        run = read_run_identity(d.parent)
    except IdentityError:
        run = None
    if run is None:
        return
    run_files = {name: file_sha256(d.parent / name) for name in RUN_FILES if (d.parent / name).is_file()}
    _save_json(tmp / CHECKPOINT_FILE, checkpoint_identity(run, phase, step, _trained_from(d) if phase == "rl" else None,
                                                          run_files or None))


def _trained_from(d: Path) -> dict | None:
    sft = [c for c in list_checkpoints(d) if c.phase == "sft"]
    if not sft:
        return None
    files, problem = read_manifest(sft[-1].path) if (sft[-1].path / MANIFEST).is_file() else ({}, "none")
    policy = files.get("policy.pt") or files.get("dcp/.metadata")
    return {"checkpoint": sft[-1].path.name, "policy_sha256": policy[1] if policy and problem is None else ""}


def _save_json(path: Path, obj: Any) -> None:
    with open(path, "w") as f:
        f.write(json.dumps(obj, indent=1) + "\n")


def load_checkpoint(
    path: str | Path,
    modules: Mapping[str, torch.nn.Module],
    optimizers: Mapping[str, torch.optim.Optimizer] = {},
    schedulers: Mapping[str, Any] = {},
    restore_rng_state: bool = True,
) -> dict:
    """Load weights/optimizers/schedulers in place, restore RNG states; returns the state dict."""
    from vagent.distributed import world

    p = Path(path)
    if not world().distributed:  # a job's rank 0 checked it when it chose it (vagent.recipes.run)
        problem = check_checkpoint(p)
        if problem is not None:
            raise CheckpointError(damaged_message(p, problem))
    state = read_state(p)
    if (p / "dcp").is_dir():
        return _load_sharded(p, state, modules, optimizers, schedulers, restore_rng_state)
    if world().distributed:
        raise ValueError(f"checkpoint {p} was written by one process (no dcp/ folder); resume it with one "
                         f"process (vagent train --resume RUN_DIR without --nproc), or start the job anew.")
    for name, module in modules.items():
        f = p / f"{name}.pt"
        if not f.is_file():
            raise FileNotFoundError(f"checkpoint {p} has no {name}.pt; it was written by a different recipe?")
        _load_into(f, lambda: module.load_state_dict(load_data(f)))
    for name, opt in optimizers.items():
        if name not in state["optimizers"]:
            raise CheckpointError(f"checkpoint {p} has no optimizer '{name}' (has {list(state['optimizers'])}); it "
                                  "was written by a different recipe?")
        _load_into(p / "state.pt", lambda: opt.load_state_dict(state["optimizers"][name]))
    for name, sched in schedulers.items():
        if name in state["schedulers"]:
            sched.load_state_dict(state["schedulers"][name])
    if restore_rng_state:
        _load_into(p / "state.pt", lambda: restore_rng(state["rng"]))
    return state


def _load_into(f: Path, load: Callable[[], Any]) -> None:
    """``load()``; an unreadable or mismatched file, or one that needs code to load, becomes a
    CheckpointError naming ``f``."""
    try:
        load()
    except UnsafeFileError as exc:
        raise CheckpointError(damaged_message(f.parent, str(exc))) from None
    except (RuntimeError, ValueError, KeyError, TypeError, EOFError, OSError, AttributeError,
            IndexError) as exc:
        raise CheckpointError(damaged_message(f.parent, f"{f.name} cannot be loaded into this run's model or "
                                                        f"optimizer ({first_line(exc)})")) from exc


# ----------------------------------------------------------------------------------------------
# the sharded layout (several ranks): torch.distributed.checkpoint
# ----------------------------------------------------------------------------------------------


def _save_sharded(d: Path, phase: str, step: int, modules: Mapping[str, torch.nn.Module],
                  optimizers: Mapping[str, torch.optim.Optimizer], schedulers: Mapping[str, Any],
                  data_position: Any, extra: Mapping[str, Any] | None, export: Callable[[Path], None] | None,
                  keep_last: int, objects: Mapping[str, Any]) -> Path:
    """Every rank writes its shards into one temporary folder; rank 0 writes state.pt and renames
    it into place (the same atomicity as one process: a killed job leaves no half checkpoint)."""
    import torch.distributed.checkpoint as dcp

    from vagent.distributed import barrier, collective, world

    w = world()
    final = d / _folder_name(phase, step)
    tmp = d / f".tmp-{final.name}-dcp"
    with _writing(tmp, final) if w.is_main else nullcontext() as lock:  # rank 0 holds the folder's lock
        barrier("checkpoint folder made")
        state_dicts = sharded_state(modules, optimizers)
        collective("checkpoint save (dcp)", lambda: dcp.save(state_dicts, checkpoint_id=tmp / "dcp"))
        _save(capture_rng(), tmp / f"rng_rank{w.rank}.pt")
        if export is not None:
            export(tmp / "policy")  # gathers the full policy on every rank; rank 0 writes it
        barrier("checkpoint shards written")
        if w.is_main:
            state = {
                "phase": phase, "step": int(step), "data_position": data_position, "rng": capture_rng(),
                "optimizers": {}, "schedulers": {k: s.state_dict() for k, s in schedulers.items()},
                "extra": dict(extra or {}), "world_size": w.size, "format": "dcp",
            }
            for name, obj in objects.items():
                _save_object(obj, tmp / f"{name}.pt")
            _save(state, tmp / "state.pt")
            _write_identity(tmp, d, phase, step)
            write_manifest(tmp)  # every rank's files: the commit point
            lock.unlink()
            _publish(tmp, final, d, phase, keep_last)
    barrier("checkpoint in place")
    return final


def _load_sharded(p: Path, state: dict, modules: Mapping[str, torch.nn.Module],
                  optimizers: Mapping[str, torch.optim.Optimizer], schedulers: Mapping[str, Any],
                  restore_rng_state: bool) -> dict:
    """Load a sharded checkpoint with this job's world size (one process included): DCP reads
    each rank's part of every tensor, whatever the sharding it was written with."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    from vagent.distributed import collective, world

    state_dicts = sharded_state(modules, optimizers)
    try:
        collective("checkpoint load (dcp)", lambda: load_dcp(state_dicts, p / "dcp"))
    except RuntimeError as exc:  # a file of dcp/ that needs code (collective wraps it in a DistributedError)
        refused = exc if isinstance(exc, UnsafeFileError) else exc.__cause__
        if not isinstance(refused, UnsafeFileError):
            raise
        raise CheckpointError(damaged_message(p, str(refused))) from None
    for k, m in modules.items():
        set_model_state_dict(m, state_dicts[f"model.{k}"])
    for k, o in optimizers.items():
        set_optimizer_state_dict(module_of(o, modules), o, state_dicts[f"optim.{k}"])
    for k, s in schedulers.items():
        if k in state["schedulers"]:
            s.load_state_dict(state["schedulers"][k])
    if restore_rng_state:
        rank_file = p / f"rng_rank{world().rank}.pt"
        rng_file = rank_file if rank_file.is_file() else p / "rng_rank0.pt"
        _load_into(rng_file, lambda: restore_rng(load_data(rng_file, LEGACY_RNG)))
    return state
