"""Run a sweep's trials as Ray Tune trials; each trial is an ordinary run directory.

The sweep directory::

    sweep.json                  rows, baseline and every trial's run config (what the report reads)
    events.jsonl                one line per trial start / resume / skip / finish / error
    trials/<row>/seed_<k>/<run>/   the trial's run directory, as ``vagent train`` writes it
    tune-<fingerprint>/         Ray Tune's experiment state (one per distinct set of trials)

Scheduling, placement and resume are Ray Tune's: one Tune trial per (row, seed) from a grid
search over the trial ids, each holding the sweep file's ``resources``. A restarted sweep restores
the Tune experiment (``Tuner.restore``): finished trials are not run again, and interrupted or
failed ones start again. A trial that starts again finds its run directory and calls
``train(resume=...)``, so it continues from the run's newest checkpoint and logs exactly what an
uninterrupted run logs (``vagent train --resume``). The trial's folder is a function of its row
and seed, so a trial whose run directory holds ``summary.json`` is finished whatever Tune's saved
state says (a sweep killed before Tune saved its state, or one whose file gained seeds).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from vagent.lifetime import exit_with_parent  # noqa: F401 (the Tune trainable calls it)
from vagent.sweep.spec import Sweep, Trial

RAY_HINT = "pip install 'vagent[ray]'"


@dataclass(frozen=True)
class SweepOutcome:
    """What one ``vagent sweep`` invocation did: trials finished in total, and those that failed
    (trial id -> error text)."""

    sweep_dir: Path
    finished: int
    total: int
    errors: dict


def write_sweep_json(sweep: Sweep, sweep_dir: Path) -> Path:
    """``sweep.json``: the rows in order, the baseline and each trial's id, row, seed and config."""
    sweep_dir.mkdir(parents=True, exist_ok=True)
    data = {
        "name": sweep.config.name,
        "baseline": sweep.baseline,
        "rows": [{"name": r.name, "values": r.values} for r in sweep.rows],
        "seeds": list(sweep.config.seeds),
        "trials": [{"id": t.trial_id, "row": t.row, "seed": t.seed, "config": t.config} for t in sweep.trials],
    }
    out = sweep_dir / "sweep.json"
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(out)
    return out


def trial_run_dirs(trial_dir: Path) -> list[Path]:
    """The run directories inside a trial's folder (normally none or one)."""
    if not trial_dir.is_dir():
        return []
    return sorted(p for p in trial_dir.iterdir() if p.is_dir() and (p / "config.yaml").is_file())


def count_finished(sweep: Sweep, sweep_dir: Path) -> int:
    """Trials whose run directory holds ``summary.json``."""
    return sum(1 for t in sweep.trials
               if any((r / "summary.json").is_file() for r in trial_run_dirs(sweep_dir / "trials" / t.trial_id)))


def _event(sweep_dir: Path, trial_id: str, event: str, **extra: Any) -> None:
    line = json.dumps({"trial": trial_id, "event": event, "time": round(time.time(), 3), "pid": os.getpid(), **extra})
    with open(sweep_dir / "events.jsonl", "a") as f:  # one short O_APPEND write per event
        f.write(line + "\n")


def execute_trial(sweep_dir: Path, trial: Trial) -> dict:
    """Run one trial to its end: skip it when finished, resume its run directory when one exists,
    else start the run. Returns the run's ``summary.json``."""
    from filelock import FileLock

    trial_dir = sweep_dir / "trials" / trial.trial_id
    trial_dir.mkdir(parents=True, exist_ok=True)
    # a worker of a killed sweep may outlive it for a moment: the trial waits until that one has exited
    with FileLock(str(trial_dir / ".lock")):
        return _execute_locked(sweep_dir, trial_dir, trial)


def _execute_locked(sweep_dir: Path, trial_dir: Path, trial: Trial) -> dict:
    from vagent.recipes import train  # imports the recipes out of the garbage collector's walks
    from vagent.runconfig import load_config

    for stray in trial_dir.iterdir():  # a process killed between creating the run folder and its config
        if stray.is_dir() and not (stray / "config.yaml").is_file():
            shutil.rmtree(stray)
    runs = trial_run_dirs(trial_dir)
    if len(runs) > 1:
        raise RuntimeError(f"trial {trial.trial_id}: {len(runs)} run directories in {trial_dir}; a trial has one. "
                           "Delete the ones you do not want and run the sweep again.")
    if runs and (runs[0] / "summary.json").is_file():
        _event(sweep_dir, trial.trial_id, "skip", run_dir=str(runs[0]))
        return json.loads((runs[0] / "summary.json").read_text())
    try:
        if runs:
            _event(sweep_dir, trial.trial_id, "resume", run_dir=str(runs[0]))
            run_dir = train(resume=runs[0], quiet=True)
        else:
            _event(sweep_dir, trial.trial_id, "start")
            run_dir = train(load_config(dict(trial.config, out_dir=str(trial_dir))), quiet=True)
    except Exception as exc:
        _event(sweep_dir, trial.trial_id, "error", error=f"{type(exc).__name__}: {exc}")
        raise
    _event(sweep_dir, trial.trial_id, "finish", run_dir=str(run_dir))
    return json.loads((Path(run_dir) / "summary.json").read_text())


def tune_trial(params: dict) -> None:
    """The Tune trainable: one trial, its summary's numbers reported to Tune."""
    from ray import tune

    exit_with_parent()
    sweep_dir = Path(params["sweep_dir"])
    trials = {t["id"]: t for t in json.loads((sweep_dir / "sweep.json").read_text())["trials"]}
    t = trials[params["trial"]]
    summary = execute_trial(sweep_dir, Trial(t["row"], t["seed"], t["config"]))
    tune.report({k: v for k, v in summary.items() if isinstance(v, (int, float))})


def _import_tune() -> Any:
    try:
        from ray import tune
    except ImportError as exc:
        raise ImportError(f"vagent sweep runs its trials on Ray Tune, which is not installed: {RAY_HINT} "
                          f"(it installs ray[tune]); the import said: {exc}") from exc
    return tune


class _TrialTraceback(logging.Filter):
    """Drops Tune's records of failed trials that the sweep says itself: "Trial task failed" (the
    failed trial's whole traceback, on the console) and "Trials did not complete" (the list of
    failed trials' reprs at the end). The sweep says each failed trial in one line, naming the
    ``error.txt`` Tune keeps its traceback in."""

    SAID_BY_THE_SWEEP = ("Trial task failed for trial", "Trials did not complete")

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.SAID_BY_THE_SWEEP)


#: the Tune loggers that write those records (ray 2.x: the controller, and ``tune.run``'s end)
TUNE_TRIAL_LOGGERS = ("ray.tune.execution.tune_controller", "ray.tune.tune")


def _quiet_trial_tracebacks() -> None:
    for name in TUNE_TRIAL_LOGGERS:
        source = logging.getLogger(name)
        if not any(isinstance(f, _TrialTraceback) for f in source.filters):
            source.addFilter(_TrialTraceback())


def _prepare_trial_environment() -> None:
    """Environment variables and log levels the trials run under (set before Ray starts)."""
    os.environ["RAY_CHDIR_TO_TRIAL_DIR"] = "0"  # relative paths in run configs keep meaning the sweep's cwd
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    # with Tune's result files off, its result grid warns once per trial that it found none; the
    # sweep reads each trial's own run directory instead, so that warning says nothing
    logging.getLogger("ray.tune.analysis.experiment_analysis").setLevel(logging.ERROR)
    _quiet_trial_tracebacks()


def _tuner(tune: Any, sweep: Sweep, sweep_dir: Path, say: Callable[[str], None]) -> Any:
    """The Tune experiment of ``sweep``: restored from ``sweep_dir`` where it ran before, else a new grid."""
    res = sweep.config.resources
    trainable = tune.with_resources(tune_trial, {"cpu": res.cpu, "gpu": res.gpu})
    name = f"tune-{sweep.fingerprint()}"
    path = sweep_dir / name
    if tune.Tuner.can_restore(str(path)):
        say(f"restoring the Tune experiment {path}: finished trials are skipped, the others resume")
        return tune.Tuner.restore(str(path), trainable, resume_unfinished=True, resume_errored=True)
    return tune.Tuner(
        trainable,
        param_space={"sweep_dir": str(sweep_dir),
                     "trial": tune.grid_search([t.trial_id for t in sweep.trials])},
        tune_config=tune.TuneConfig(max_concurrent_trials=sweep.config.max_concurrent or None),
        run_config=tune.RunConfig(name=name, storage_path=str(sweep_dir), verbose=0,
                                  failure_config=tune.FailureConfig(max_failures=0)),
    )


def _trial_errors(results: Any) -> dict[str, str]:
    """Trial id -> the last line of its error and where Tune keeps the traceback, for each failed trial."""
    errors = {}
    for r in results:
        if r.error is not None:
            traceback = f"traceback: {Path(r.path) / 'error.txt'}" if r.path else "Tune kept no traceback"
            errors[(r.config or {}).get("trial", "?")] = f"{str(r.error).strip().splitlines()[-1]} ({traceback})"
    return errors


def run_sweep(sweep: Sweep, sweep_dir: Path, num_cpus: int | None = None, num_gpus: int | None = None,
              say: Callable[[str], None] = print) -> SweepOutcome:
    """Run (or continue) every trial of ``sweep`` on a local Ray cluster of ``num_cpus`` CPUs
    (default: all) and ``num_gpus`` GPUs (default: Ray's count)."""
    from vagent.models.remote import start_ray
    from vagent.numerics import pin_cpu_kernels

    pin_cpu_kernels()  # the Ray workers inherit it: trials use the kernels ``vagent train`` uses
    tune = _import_tune()
    import ray

    sweep_dir = sweep_dir.resolve()
    write_sweep_json(sweep, sweep_dir)
    res = sweep.config.resources
    n_total = len(sweep.trials)
    done = count_finished(sweep, sweep_dir)
    say(f"sweep {sweep.config.name}: {len(sweep.rows)} rows x {len(sweep.config.seeds)} seeds = {n_total} trials "
        f"({done} finished already), {res.cpu:g} CPU / {res.gpu:g} GPU each; directory {sweep_dir}")
    _prepare_trial_environment()
    started = not ray.is_initialized()
    if started:
        try:
            start_ray(num_cpus, num_gpus=num_gpus)
        except RuntimeError as exc:
            raise RuntimeError(f"{exc} (then run the sweep again: finished trials are kept)") from exc
    try:
        errors = _trial_errors(_tuner(tune, sweep, sweep_dir, say).fit())
    finally:
        if started:
            ray.shutdown()
    return SweepOutcome(sweep_dir, count_finished(sweep, sweep_dir), n_total, errors)
