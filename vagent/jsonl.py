"""JSON Lines files read record by record, each with its ``path:line`` for the error messages of
the code that validates it (SFT chat files, ViGoRL datasets)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator


def read_records(path: Path, error: type[Exception]) -> Iterator[tuple[Any, str]]:
    """``(record, "path:line")`` for each non-blank line of ``path`` (1-based line numbers), in order.

    A line that is not JSON raises ``error("path:line: not valid JSON (...).")``: the caller's own
    data error, so that its handlers and messages stay as they are."""
    for no, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{no}"
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise error(f"{where}: not valid JSON ({exc}).") from exc
        yield rec, where
