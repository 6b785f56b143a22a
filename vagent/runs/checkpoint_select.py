"""Which checkpoint a resume starts from: the newest one that is intact and this run's own.

:func:`select_checkpoint` (what ``--resume`` uses) walks a run's checkpoints newest first and
skips, saying why, each one that is damaged (:func:`vagent.runs.checkpoint_check.check_checkpoint`)
or not this run's state (:func:`identity_problem`: another run's, relabelled, trained under another
config, an in-flight rollout of another step, an RL checkpoint whose SFT checkpoint is gone or
changed). :func:`recorded_run_file` and :func:`trained_from` read what a checkpoint's
``identity.json`` recorded (:mod:`vagent.runs.identity`). Temporary folders of killed saves are
never candidates (:func:`~vagent.runs.checkpoint_check.list_checkpoints` skips them); the next save or
resume removes them (:func:`vagent.runs.manifest.remove_stale_temporaries`).

Every name here is importable from :mod:`vagent.runs.checkpoint` too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from vagent.runs.checkpoint_check import (
    PHASES, CheckpointError, CheckpointInfo, check_checkpoint, first_line, is_verified, list_checkpoints,
    state_or_problem,
)
from vagent.runs.identity import (
    CHECKPOINT_FILE, IdentityError, RunIdentity, in_flight_problem, read_checkpoint_identity, read_run_identity,
    run_files_problem,
)
from vagent.runs.manifest import MANIFEST, read_manifest
from vagent.runs.safe_load import RECORDS, UnsafeFileError, load_data


def select_checkpoint(ckpt_dir: str | Path, phase: str | None = None, say: Callable[[str], None] = print,
                      run: RunIdentity | None = None) -> CheckpointInfo | None:
    """The newest intact checkpoint (of ``phase``, or any) in ``ckpt_dir`` that belongs to ``run``,
    None if there is none.

    A damaged newer one is reported through ``say`` (which file, what is wrong) and skipped, and so
    is one that is not this run's state (:func:`identity_problem`: another run's, relabelled, or an
    RL checkpoint whose SFT checkpoint is gone): the run resumes from the newest one left and
    writes the later steps again. If every checkpoint is skipped, :class:`CheckpointError` lists
    them (never a silent start from scratch). A run-level file that the chosen checkpoint recorded
    (the canary's probe: :func:`run_files_problem`) and that changed since is a CheckpointError
    too: no other checkpoint would fix it."""
    found = [c for c in list_checkpoints(ckpt_dir) if phase is None or c.phase == phase]
    skipped: list[str] = []
    for c in reversed(found):
        problem = check_checkpoint(c.path)
        if problem is not None:
            skipped.append(f"{c.path.name}: {problem}")
            say(f"warning: checkpoint {c.path} is damaged ({problem}); it is skipped")
            continue
        problem = identity_problem(c, run)
        if problem is not None:
            skipped.append(f"{c.path.name}: {problem}")
            say(f"warning: checkpoint {c.path} is skipped: {problem}")
            continue
        if skipped:
            say(f"warning: resuming from {c.path.name}, the newest intact checkpoint; the steps after it run again")
        if not is_verified(c.path):
            say(f"warning: checkpoint {c.path} has no manifest (written by an older vagent): resuming from it "
                "unverified (its .pt files pass their CRC check)")
        problem = run_files_problem(c.path)
        if problem is not None:
            raise CheckpointError(problem)
        return c
    if skipped:
        raise CheckpointError(f"no intact checkpoint in {ckpt_dir}: " + "; ".join(skipped) + ". Restore the folders "
                              "from a copy of the run directory, or start a new run with its config (vagent train "
                              f"--config {Path(ckpt_dir).parent / 'config.yaml'}); nothing in the run was changed.")
    return None


def identity_problem(c: CheckpointInfo, run: RunIdentity | None) -> str | None:
    """None when checkpoint ``c`` holds the state its folder name says, of run ``run``; else why
    not. Checked: its ``identity.json`` (run id, config's state hash, phase and step) against the
    run and the folder name, its ``state.pt`` step against the folder name, its ``inflight.pt``
    (:func:`_in_flight_problem`) against its step and the run, and for an RL checkpoint that the
    SFT checkpoint it trained from is there, intact and the same. In a run (``run`` given: its
    run.json) every checkpoint has ``identity.json``, so one without is refused; a checkpoint
    saved outside a run directory (``run`` None) is checked by its state.pt and inflight.pt."""
    ident, problem = read_checkpoint_identity(c.path)
    if problem is not None:
        return problem
    held, problem = _held_step(c.path)
    if held is None:
        return problem
    if held != (c.phase, c.step):
        return (f"its state.pt holds {held[0]} step {held[1]} but its folder is named {c.path.name} "
                "(renamed or copied over another step's folder)")
    if run is not None and ident is None and c.path.name not in run.adopted:
        return (f"it has no {CHECKPOINT_FILE}, which every checkpoint of a run with run.json has (removed, with its "
                "manifest rewritten, or copied in from elsewhere); restore the folder from a copy of the run directory")
    if ident is None or run is None:
        return _in_flight_problem(c, None)
    if (ident["phase"], ident["step"]) != (c.phase, c.step):
        return (f"its {CHECKPOINT_FILE} says {ident['phase']} step {ident['step']} but its folder is named "
                f"{c.path.name} (renamed or copied over another step's folder)")
    if ident["run_id"] != run.run_id:
        return (f"it belongs to another run (run id {ident['run_id'][:12]}, this run's is {run.run_id[:12]}): "
                "copied in from another run directory?")
    if ident["state_hash"] != run.state_hash:
        return ("it was trained under another config (its state hash differs from config.yaml's): a config change, "
                "not damage; restore the run's config.yaml to resume from it")
    tf = ident.get("trained_from")
    return _in_flight_problem(c, run.run_id) or (
        None if tf is None else _lineage_problem(c.path.parent / tf["checkpoint"], tf["policy_sha256"]))


def _in_flight_problem(c: CheckpointInfo, run_id: str | None) -> str | None:
    """Why ``c``'s ``inflight.pt`` (an overlapped run's rollout in flight) is not the one a resume
    from ``c`` starts with (:func:`in_flight_problem`), as a reason to skip ``c``; None when it is,
    or when ``c`` has none. Read as data, memory-mapped."""
    f = c.path / "inflight.pt"
    if not f.is_file():
        return None
    try:
        saved = load_data(f, RECORDS, mmap=True)
    except UnsafeFileError as exc:
        return str(exc)
    except Exception as exc:  # damaged: whatever torch raises
        return f"its inflight.pt cannot be read ({first_line(exc)})"
    problem = in_flight_problem(saved, c.step if c.phase == "rl" else -1, run_id)
    return None if problem is None else f"its {problem}"


def recorded_run_file(ckpt_dir: str | Path, name: str) -> tuple[str, str] | None:
    """(checkpoint name, SHA-256) of run-level file ``name`` as the newest checkpoint in
    ``ckpt_dir`` of the run in ``ckpt_dir/../run.json`` recorded it; None when none did (no
    checkpoint since the file was written, a run without run.json, an older vagent's)."""
    d = Path(ckpt_dir)
    try:
        run = read_run_identity(d.parent)
    except IdentityError:
        run = None
    if run is None:
        return None
    for c in reversed(list_checkpoints(d)):
        ident, _ = read_checkpoint_identity(c.path)
        if ident is not None and ident["run_id"] == run.run_id and name in ident.get("run_files", {}):
            return c.path.name, ident["run_files"][name]
    return None


def _lineage_problem(sft: Path, policy_sha256: str) -> str | None:
    """Whether SFT checkpoint ``sft`` is still the one an RL checkpoint trained from."""
    if not (sft / MANIFEST).is_file():
        return f"it trained from {sft.name} (its KL reference), which is gone; it falls back with it"
    problem = check_checkpoint(sft)
    if problem is not None:
        return f"it trained from {sft.name} (its KL reference), which is damaged ({problem}); it falls back with it"
    files, _ = read_manifest(sft)
    policy = files.get("policy.pt") or files.get("dcp/.metadata")
    if policy is None or policy[1] != policy_sha256:
        return f"it trained from another {sft.name} than the one in the run (its policy differs); it falls back with it"
    return None


def _held_step(p: Path) -> tuple[tuple[str, int] | None, str | None]:
    """((phase, step) that ``p/state.pt`` holds, None) -- read as data, memory-mapped (the optimizer
    states are not loaded) -- or (None, what is wrong with it)."""
    state, problem = state_or_problem(p, mmap=True)
    if problem is not None:
        return None, problem
    if state.get("phase") not in PHASES or type(state.get("step")) is not int:
        return None, f"state.pt holds no phase and step (phase {state.get('phase')!r}, step {state.get('step')!r})"
    return (state["phase"], state["step"]), None


def trained_from(path: str | Path) -> Path | None:
    """The SFT checkpoint RL checkpoint ``path`` trained from (its identity's ``trained_from``); None
    when it names none."""
    ident, _ = read_checkpoint_identity(Path(path))
    tf = ident.get("trained_from") if ident else None
    return Path(path).parent / tf["checkpoint"] if tf else None
