"""Run infrastructure: the run directory, metrics, checkpoints, rollout samples, plots, progress.

Recipes (``vagent.recipes``) call these small pieces; none of them knows about an algorithm.

- :mod:`vagent.runs.rundir`     the run directory layout and step convention, new and resumed runs
- :mod:`vagent.runs.metrics`    ``metrics.jsonl`` + TensorBoard (+ optional W&B), fixed prefixes
- :mod:`vagent.runs.checkpoint` atomic checkpoints with RNG states, keep-last-N, exact resume
- :mod:`vagent.runs.checkpoint_check`  what a checkpoint folder holds and whether it can be trusted
- :mod:`vagent.runs.checkpoint_select` which checkpoint a resume starts from (identity, lineage, in-flight)
- :mod:`vagent.runs.manifest`   checkpoint manifests (size + SHA-256 of each file), writer locks, stale folders
- :mod:`vagent.runs.samples`    sampled rollouts as JSONL + PNG frames, size-capped
- :mod:`vagent.runs.tokens`     the sampled rows' tokens, masks, log-probs, values, advantages (``vagent view``)
- :mod:`vagent.runs.plots`      learning-curve PNGs
- :mod:`vagent.runs.progress`   config summary, start-up arithmetic, progress with ETA, ``train.log``, library output
- :mod:`vagent.runs.errors`     NaN/inf, out-of-memory, full-disk and model errors with the fix in the message
- :mod:`vagent.runs.lock`       one writer per run directory: ``run.lock``, held by the live job
"""

from vagent.runs.checkpoint import list_checkpoints, load_checkpoint, load_object, save_checkpoint
from vagent.runs.errors import (
    DiskFullError, ModelError, NonFiniteError, TrainingError, check_finite, is_disk_full, is_oom, oom_message,
)
from vagent.runs.metrics import PREFIXES, MetricsLogger, read_metrics
from vagent.runs.plots import plot_run, plots_current
from vagent.runs.progress import Console, StepProgress, startup_arithmetic
from vagent.runs.rundir import RunDir, existing_run_dir, new_run_dir
from vagent.runs.samples import save_rollouts
from vagent.runs.tokens import save_token_rows

__all__ = [
    "list_checkpoints", "load_checkpoint", "load_object", "save_checkpoint", "ModelError", "NonFiniteError",
    "TrainingError",
    "check_finite", "is_oom", "DiskFullError", "is_disk_full", "oom_message", "PREFIXES", "MetricsLogger",
    "read_metrics", "plot_run", "plots_current",
    "Console", "StepProgress", "startup_arithmetic", "RunDir", "existing_run_dir", "new_run_dir", "save_rollouts",
    "save_token_rows",
]
