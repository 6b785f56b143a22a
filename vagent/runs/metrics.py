"""Metric logging: ``metrics.jsonl`` (the source of truth), TensorBoard, optional W&B.

Every metric name starts with one of :data:`PREFIXES` (docs/metrics/training.md lists each one);
an unknown prefix is a programming error and raises, so no undocumented metric slips in.
Values must be finite numbers or they are logged as strings ("nan", "inf") in the JSONL and
skipped by TensorBoard; the recipes stop on a non-finite loss before logging it
(:mod:`vagent.runs.errors`).

On resume, :meth:`MetricsLogger.truncate_after` drops the records a killed run wrote after its
last checkpoint, so the file reads as one uninterrupted run.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any, Iterable, Mapping

PREFIXES = (
    "rollout/", "reward/", "loss/", "actor/", "critic/", "optim/", "perf/", "val/", "sft/", "filter/", "mismatch/",
    "correction/", "sync/",
)


#: metric-name prefixes and keys (and any key ending in ``_s``) that measure time, not the computation
TIMING_PREFIXES = ("perf/", "time/")
TIMING_KEYS = ("time", "wall_time", "elapsed_s")


def without_timing(record: Mapping[str, Any]) -> dict[str, Any]:
    """``record`` without the fields that measure time: what two runs of one seed must agree on."""
    return {k: v for k, v in record.items()
            if not k.startswith(TIMING_PREFIXES) and k not in TIMING_KEYS and not k.endswith("_s")}


def check_names(metrics: Mapping[str, Any]) -> None:
    bad = [k for k in metrics if not k.startswith(PREFIXES)]
    if bad:
        raise ValueError(f"metric name(s) {bad} have no documented prefix; use one of {PREFIXES}.")


def _jsonable(v: object) -> Any:
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return v


def read_metrics(path: str | Path) -> list[dict]:
    """All records of a ``metrics.jsonl`` (a torn last line from a killed process is skipped)."""
    out: list[dict] = []
    p = Path(path)
    if not p.is_file():
        return out
    for line in p.read_text().splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut by SIGKILL
    return out


def torn_last_record(path: str | Path) -> int:
    """The length in bytes of a cut last record of ``metrics.jsonl`` (no line end, or not a JSON
    object: the writer was killed or the disk filled mid-write); 0 when the file ends whole."""
    p = Path(path)
    try:
        size = p.stat().st_size
    except OSError:
        return 0
    if size == 0:
        return 0
    with open(p, "rb") as f:
        f.seek(max(0, size - (1 << 20)))
        tail = f.read()
    if tail.endswith(b"\n"):
        return 0
    last = tail.rsplit(b"\n", 1)[-1]
    return len(last)


def _parse_line(line: bytes) -> dict | None:
    try:
        record = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None  # a line cut by SIGKILL or a full disk
    return record if isinstance(record, dict) else None


class MetricsLogger:
    """Appends records to ``metrics.jsonl`` and mirrors them to TensorBoard / W&B."""

    def __init__(self, root: str | Path, tensorboard: bool = True, wandb: bool = False,
                 wandb_project: str = "vagent", run_name: str = "", config: dict | None = None):
        self.root = Path(root)
        self.path = self.root / "metrics.jsonl"
        self._tb = None
        self._wandb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(self.root))
        if wandb:
            try:
                import wandb as _wandb
            except ImportError as exc:
                raise RuntimeError(
                    "log.wandb is true but the wandb package is not installed: pip install wandb "
                    "(set WANDB_MODE=offline to log without an account), or set log.wandb=false."
                ) from exc
            self._wandb = _wandb.init(project=wandb_project, name=run_name, dir=str(self.root),
                                      config=config or {}, resume="allow")

    def log(self, step: int, metrics: Mapping[str, Any], phase: str = "rl") -> dict:
        """Write one record ``{"phase", "step", "time", **metrics}``; returns it."""
        check_names(metrics)
        record = {"phase": phase, "step": int(step), "time": round(time.time(), 3)}
        record.update({k: _jsonable(v) for k, v in metrics.items()})
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())
        scalars = {k: v for k, v in record.items() if k not in ("phase", "step", "time")
                   and isinstance(v, (int, float)) and not isinstance(v, bool)}
        if self._tb is not None:
            for k, v in scalars.items():
                self._tb.add_scalar(k, v, global_step=int(step))
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log({**scalars, "phase_step": step}, step=None)
        return record

    def truncate_after(self, phase_order: Iterable[str], phase: str, step: int) -> int:
        """Drop records later than (``phase``, ``step``) in the order ``phase_order``; returns how many.

        A record is kept when its phase comes before ``phase`` or it is the same phase with a
        step up to ``step``: a checkpoint of step k is written after every record labelled k
        (the k-th update's metrics and the validation after it), and the resumed run logs k + 1 next.
        A torn last line (a process killed, or a disk that filled, mid-write) is dropped too. When
        the kept records are the file's first lines (the usual case) the file is cut in place,
        which needs no free disk space; otherwise it is rewritten.
        """
        order = {p: i for i, p in enumerate(phase_order)}
        limit = (order[phase], step)
        data = self.path.read_bytes() if self.path.is_file() else b""
        lines = data.splitlines(keepends=True)
        records = [_parse_line(line) for line in lines]
        keep = [r is not None and line.endswith(b"\n") and (order.get(r.get("phase"), 0), r.get("step", 0)) <= limit
                for r, line in zip(records, lines)]
        dropped = sum(1 for r, k in zip(records, keep) if r is not None and not k)
        cut = keep.index(False) if False in keep else len(keep)
        if not any(keep[cut:]):  # everything kept comes first: cut the file there
            end = sum(len(line) for line in lines[:cut])
            if end < len(data):
                os.truncate(self.path, end)
            return dropped
        tmp = self.path.with_suffix(".jsonl.tmp")
        tmp.write_bytes(b"".join(line for line, k in zip(lines, keep) if k))
        os.replace(tmp, self.path)
        return dropped

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()
