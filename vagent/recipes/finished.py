"""Is a run directory finished? Light (no torch): ``vagent train --resume`` of a finished run says
so before torch and the recipes load, in one process, in each rank of a job and in the launcher."""

from __future__ import annotations

from pathlib import Path


def finished(root: Path, quiet: bool) -> bool:
    """Does the run have summary.json (written last: nothing is left to do)? Says so unless quiet."""
    if not (root / "summary.json").is_file():
        return False
    if not quiet:
        print(f"{root} is finished (it has summary.json); nothing to resume, nothing changed. "
              "Start a new run to train further.", flush=True)
    return True
