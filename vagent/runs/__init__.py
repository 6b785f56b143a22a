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

from __future__ import annotations

from vagent.startup import lazy_exports

#: each public name -> the module that defines it, loaded on first use: importing one light piece
#: (``vagent.runs.errors``, which a Ray replica actor's module imports) loads no torch
_HOME = {
    **dict.fromkeys(["list_checkpoints", "load_checkpoint", "load_object", "save_checkpoint"], "checkpoint"),
    **dict.fromkeys(["DiskFullError", "ModelError", "NonFiniteError", "TrainingError", "check_finite", "is_disk_full",
                     "is_oom", "oom_message"], "errors"),
    **dict.fromkeys(["PREFIXES", "MetricsLogger", "read_metrics"], "metrics"),
    **dict.fromkeys(["plot_run", "plots_current"], "plots"),
    **dict.fromkeys(["Console", "StepProgress", "startup_arithmetic"], "progress"),
    **dict.fromkeys(["RunDir", "existing_run_dir", "new_run_dir"], "rundir"),
    "save_rollouts": "samples",
    "save_token_rows": "tokens",
}

__all__ = list(_HOME)
__getattr__ = lazy_exports(__name__, {name: f"vagent.runs.{module}" for name, module in _HOME.items()})
