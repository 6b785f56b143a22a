"""The run directory: where one training run keeps everything it writes.

Layout (``runs/<name>-<timestamp>/`` by default)::

    config.yaml            the resolved config (``--resume`` reads it back)
    run.json               the run's identity: run id, the config it started with, the changes
                           accepted on resume (vagent.runs.identity; checked by ``--resume``)
    metrics.jsonl          one JSON object per logged step: {"phase", "step", "time", metric: value...}
    events.out.tfevents.*  TensorBoard events (``tensorboard --logdir runs``)
    rollouts/step_<step>.jsonl + rollouts/step_<step>/*.png   sampled episodes (size-capped)
    checkpoints/step_<step>/   policy, critic, optimizers, schedulers, RNG states (keep-last-N),
                           manifest.json (each file's size and SHA-256, checked on resume)
    plots/*.png            learning curves, redrawn as the run goes
    train.log              what was printed (config summary, start-up arithmetic, model build and
                           progress lines with ETA, library warnings, errors)
    summary.json           key numbers, written when the run has finished (``--resume`` then does nothing)
    run.lock               held by the live job's writer (PID, host): one writer per run directory
                           (vagent.runs.lock; a second ``--resume`` is refused while it lives)

Steps: step k of a phase (SFT, or RL) is the state after k updates of that phase. Metrics of the
k-th update, its rollouts (``rollouts/step_k``, the episodes the update trained on), its checkpoint
(``checkpoints/step_k``) and the progress bar count 1..N; validation runs at RL step 0 (the policy
after SFT, before RL) and after updates, so its steps run 0..N. Everything labelled k is written
before checkpoint k, so a resume from it keeps the records up to k (docs/metrics.md).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from vagent.runs.manifest import fsync_dir


@dataclass(frozen=True)
class RunDir:
    """Paths inside one run directory."""

    root: Path

    @property
    def config(self) -> Path:
        return self.root / "config.yaml"

    @property
    def identity(self) -> Path:
        return self.root / "run.json"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def rollouts(self) -> Path:
        return self.root / "rollouts"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def plots(self) -> Path:
        return self.root / "plots"

    @property
    def log(self) -> Path:
        return self.root / "train.log"

    def make(self) -> "RunDir":
        for p in (self.root, self.rollouts, self.checkpoints, self.plots):
            p.mkdir(parents=True, exist_ok=True)
        return self


def write_atomic(path: str | Path, data: str | bytes) -> None:
    """Write ``path`` whole or not at all: a temporary file beside it, flushed to disk, renamed over
    it, the directory synced. A full disk or a kill leaves the previous content (or no file),
    never an empty or cut one; the temporary file is removed on error."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def due(every: int, step: int, last: int) -> bool:
    """Whether a periodic action (checkpoint, rollout dump, plot, validation) runs at ``step``
    (1..``last``): every ``every`` steps and at the last step; never when ``every`` is 0."""
    return bool(every) and (step % every == 0 or step == last)


def new_run_dir(out_dir: str | Path, name: str, now: float | None = None) -> RunDir:
    """Create ``<out_dir>/<name>-<YYYYmmdd-HHMMSS>`` (a numeric suffix if it exists already)."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now if now is not None else time.time()))
    base = Path(out_dir).expanduser() / f"{name}-{stamp}"
    root, i = base, 1
    while True:
        try:
            base.parent.mkdir(parents=True, exist_ok=True)
            root.mkdir()  # atomic: two runs started in the same second get two folders, never one
            return RunDir(root).make()
        except FileExistsError:
            root = base.with_name(f"{base.name}-{i}")
            i += 1


def existing_run_dir(path: str | Path) -> RunDir:
    """A run directory to resume; errors say what is missing."""
    root = Path(path).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(
            f"--resume {str(root)!r}: no such directory. Pass the run directory printed at start-up "
            "(it holds config.yaml and checkpoints/)."
        )
    rd = RunDir(root)
    if not rd.config.is_file():
        raise FileNotFoundError(
            f"--resume {str(root)!r}: no config.yaml there; is this a run directory (runs/<name>-<time>)?"
        )
    return rd.make()
