"""What a checkpoint folder is, and whether it can be trusted: the checks behind loading and resuming.

- :func:`list_checkpoints`: the complete checkpoint folders of a run (``step_<step>``, ``sft_<step>``;
  temporary ``.tmp-*`` folders are not checkpoints), as :class:`CheckpointInfo`, oldest first;
- :func:`check_checkpoint`: None when a folder is intact, else what is wrong, naming the file: every
  file's size and SHA-256 against its manifest (:mod:`vagent.runs.manifest`), or the CRC-32 of each
  ``.pt`` file of an older vagent's checkpoint without one; either way no pickle in it may name a
  global that vagent does not load (:mod:`vagent.runs.safe_load`);
- :func:`state_or_problem` / :func:`read_state`: ``state.pt`` read as data, with its schema
  (:data:`STATE_KEYS`) checked;
- :func:`damaged_message`: the one-line :class:`CheckpointError` text, naming the intact
  checkpoints beside a damaged one.

Saving and loading are in :mod:`vagent.runs.checkpoint`, the choice of the checkpoint a resume
starts from in :mod:`vagent.runs.checkpoint_select`; every name here is importable from
:mod:`vagent.runs.checkpoint` too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vagent.runs.errors import TrainingError
from vagent.runs.manifest import MANIFEST, check_zip_files, verify_manifest
from vagent.runs.safe_load import LEGACY_RNG, RECORDS, UnsafeFileError, data_problem, load_data, load_pickle_data

PHASES = ("sft", "rl")
_NAME = re.compile(r"^(sft|step)_(\d{6,})$")


class CheckpointError(TrainingError):
    """A checkpoint cannot be loaded (damaged, truncated, another schema); the message names the
    file and the intact checkpoints beside it."""


#: the keys of ``state.pt`` (the schema ``load_checkpoint`` reads)
STATE_KEYS = ("phase", "step", "data_position", "rng", "optimizers", "schedulers", "extra")


@dataclass(frozen=True)
class CheckpointInfo:
    path: Path
    phase: str
    step: int

    @property
    def order(self) -> tuple[int, int]:
        return (PHASES.index(self.phase), self.step)


def list_checkpoints(ckpt_dir: str | Path) -> list[CheckpointInfo]:
    """Complete checkpoints in ``ckpt_dir``, oldest first (temporary folders are ignored; a
    complete one has its manifest, or state.pt when written before manifests)."""
    d = Path(ckpt_dir)
    if not d.is_dir():
        return []
    out = []
    for p in d.iterdir():
        m = _NAME.match(p.name)
        if m and ((p / MANIFEST).is_file() or (p / "state.pt").is_file()):
            out.append(CheckpointInfo(p, "sft" if m.group(1) == "sft" else "rl", int(m.group(2))))
    return sorted(out, key=lambda c: c.order)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def read_state(p: Path) -> dict:
    """``state.pt`` with the schema :data:`STATE_KEYS`; else a CheckpointError naming the file."""
    state, problem = state_or_problem(p)
    if problem is not None:
        raise CheckpointError(damaged_message(p, problem))
    return state


def state_or_problem(p: Path, mmap: bool = False) -> tuple[Any, str | None]:
    """(``p/state.pt`` read as data, None), or (None, what is wrong with it). ``mmap``: tensors
    stay on disk (a schema check)."""
    try:
        state = load_data(p / "state.pt", LEGACY_RNG, mmap=mmap)
    except UnsafeFileError as exc:
        return None, str(exc)
    except Exception as exc:  # truncated, empty, not a torch file: whatever torch raises
        return None, f"state.pt cannot be read ({first_line(exc)})"
    missing = [k for k in STATE_KEYS if k not in state] if isinstance(state, dict) else list(STATE_KEYS)
    if missing or not isinstance(state.get("optimizers"), dict) or not isinstance(state.get("schedulers"), dict):
        return None, (f"state.pt is not a vagent checkpoint state (missing {missing or 'dicts'}; expected the keys "
                      f"{list(STATE_KEYS)})")
    return state, None


_VERIFIED: dict[tuple[str, int, int, str], None] = {}  # manifests verified by this process (a resume verifies once)


def check_checkpoint(path: str | Path, under: str = "") -> str | None:
    """None if checkpoint folder ``path`` is intact; else what is wrong, naming the file. With a
    manifest: every file's size and SHA-256 (only those under ``under``, e.g. ``policy/`` for an
    evaluation); without (an older vagent's): each .pt file's CRC-32 and state.pt's schema (nothing
    for ``under``: the exported policy carries no checksums of its own). Either way (unless
    ``under``), every pickle in it must be data (:func:`_code_problem`): a manifest proves a file
    is the one it lists, and anyone who can write the folder can rewrite the manifest."""
    p = Path(path)
    m = p / MANIFEST
    if m.is_file():
        st = m.stat()
        key = (str(p.resolve()), st.st_mtime_ns, st.st_size, under)
        if key in _VERIFIED or (*key[:3], "") in _VERIFIED:
            return None
        problem = verify_manifest(p, under) or (None if under else _code_problem(p))
        if problem is None:
            _VERIFIED[key] = None
        return problem
    if under:
        return None
    return check_zip_files(p) or _code_problem(p) or state_or_problem(p, mmap=True)[1]


def _code_problem(p: Path) -> str | None:
    """None when no pickle in checkpoint ``p`` names a global that vagent does not load (its
    ``.pt`` files: :data:`~vagent.runs.safe_load.LEGACY_RNG` for state.pt and rng_rank*.pt,
    :data:`~vagent.runs.safe_load.RECORDS` for the others; ``dcp/.metadata``: DCP's classes); else
    the file and the global. Nothing is unpickled but ``dcp/.metadata``, by an unpickler that
    admits DCP's classes only."""
    for f in sorted(p.glob("*.pt")):
        problem = data_problem(f, LEGACY_RNG if f.name == "state.pt" or f.name.startswith("rng") else RECORDS)
        if problem is not None:
            return problem
    meta = p / "dcp" / ".metadata"
    if meta.is_file():
        try:
            load_pickle_data(meta, "dcp/.metadata")
        except UnsafeFileError as exc:
            return str(exc)
        except Exception as exc:  # truncated, not a pickle
            return f"dcp/.metadata cannot be read ({first_line(exc)})"
    return None


def damaged_message(p: Path, problem: str) -> str:
    intact = [c.path.name for c in list_checkpoints(p.parent) if c.path != p and check_checkpoint(c.path) is None]
    beside = (f"checkpoints beside it that pass their checks: {', '.join(intact)}; restore {p.name} from a copy of the "
              f"run directory, or move it out of {p.parent} to resume from {intact[-1]}"
              if intact else "no intact checkpoint beside it (restore the folder from a copy of the run directory, or "
              "start a new run with its config: vagent train --config RUN/config.yaml)")
    return f"checkpoint {p} is damaged: {problem}; {beside}."


def is_verified(path: str | Path) -> bool:
    """Whether checkpoint ``path`` has a manifest (older checkpoints load unverified)."""
    return (Path(path) / MANIFEST).is_file()
