"""``train``: one run from config to plots -- the run directory, the model, SFT, then PPO/GRPO.

The order, top to bottom::

    run dir being resumed: finished (summary.json)? then say so and change nothing
    run dir being resumed: its config and identity checked (vagent.recipes.resume; nothing written)
    run dir being resumed: take its lock (run.lock: one writer; a live one -> refused with its PID)
    seeds, threads, device, bf16
    resume: the checkpoint to continue from, accepted -> only then config.yaml / run.json written
    model directory (the tiny model is built once under model.cache_dir) -> load -> compatible?
    new run dir <- config.yaml, its lock; train.log <- what was printed so far (the build's progress)
    config summary, start-up arithmetic
    resume: metrics.jsonl cut back to the checkpoint
    SFT warm start (sft.steps > 0), skipped when an SFT-complete checkpoint exists
    PPO or GRPO (recipe), from step 0 or the checkpoint's step
    plots, summary.json

Resuming (``--resume RUN_DIR``) continues exactly: the config is read from the run directory, the
newest intact checkpoint (its manifest verified; a damaged newer one is named and skipped)
restores weights, optimizers, schedules and RNG states, rollout seeds and sampling seeds are
functions of (run seed, step), and records the killed process wrote after that checkpoint are
dropped from ``metrics.jsonl``; temporary folders of saves that were killed are deleted. Out of
disk space anywhere is one :class:`~vagent.runs.errors.DiskFullError` line (the path, the free
space); the checkpoints already written stay intact and the run resumes once space is freed. Resuming a finished run (one with
``summary.json``) prints that it is finished and writes nothing; with overrides that ask it for
more (``steps=60``) it is an error that says how to continue. A refused resume writes nothing to
the run directory but its lock and its ``train.log`` lines.

While the run runs, Python warnings and the messages of transformers / huggingface_hub go to
``train.log`` only and their progress bars are off (``vagent.runs.progress``); every long phase
shows one progress display with ETA, on the console and in ``train.log``.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from vagent.config import ConfigError
from vagent.distributed import broadcast_object, init_world, rank_device
from vagent.distributed import world as current_world
from vagent.models.loading import LoadedModel, count_parameters
from vagent.recipes.common import check_compatible, check_remote_envs, load_model, resolve_device, use_bf16
from vagent.runconfig import RunConfig, load_config
from vagent.runconfig.ranges import check_out_dir
from vagent.recipes.finished import finished
from vagent.recipes.grpo import train_grpo
from vagent.recipes.ppo import train_ppo
from vagent.recipes.consent import CodeConsent, check_run_code
from vagent.recipes.resume import Resume, check_resumable, resume_config, write_new_run_files
from vagent.recipes.session import Session, SilentLogger
from vagent.recipes.sft import train_sft
from vagent.recipes.tiny_cache import prepare_model_once
from vagent.rollout.driver import check_rollout_setup
from vagent.runs import (
    Console, MetricsLogger, TrainingError, existing_run_dir, is_disk_full, is_oom, load_checkpoint, new_run_dir,
    oom_message, plot_run, plots_current, read_metrics, startup_arithmetic,
)
from vagent.runs.checkpoint import CheckpointError, CheckpointInfo, select_checkpoint, trained_from
from vagent.runs.environment import record_environment
from vagent.runs.errors import disk_full_error
from vagent.runs.hub import HubUploader, start_hub_upload
from vagent.runs.lock import RunDirLocked, lock_run_dir
from vagent.runs.manifest import remove_stale_temporaries
from vagent.runs.metrics import torn_last_record
from vagent.runs.progress import ConfigSource, config_summary, library_output_to_log
from vagent.runs.rundir import RunDir, write_atomic


def train(cfg: RunConfig | None = None, resume: str | Path | None = None, quiet: bool = False,
          source: ConfigSource | None = None, overrides: Sequence[str] = (),
          consent: CodeConsent = CodeConsent()) -> Path:
    """Run (or resume) a training run; returns its run directory. Errors raise
    :class:`vagent.runs.TrainingError` (or ConfigError) with the fix in the message. ``source``: a
    :class:`vagent.runs.progress.ConfigSource` (the --config file and overrides ``cfg`` came from),
    so that the config summary lists what they set. ``overrides``: with ``resume``, the changes of
    fields that may change (``steps=6``; :mod:`vagent.recipes.resume`), recorded in the run ``consent``: the code the
    resumed run's config names that the user vouches for (:class:`vagent.recipes.resume.CodeConsent`;
    none by default: a config naming ``imports`` or ``model.trust_remote_code`` is refused)."""
    t_start = time.time()
    run, plan = None, None
    if resume is not None:
        if cfg is not None:
            raise ConfigError("--resume continues a run with its saved config.yaml; do not pass a config.")
        run = existing_run_dir(resume)
        check_run_code(run.config, consent)  # a run directory is data: the code it names runs only with consent
        if finished(run.root, quiet or os.environ.get("RANK", "0") != "0", overrides):  # a job's rank 0 says it, once
            return run.root
        plan = resume_config(run, overrides, consent)  # before any model work; it writes once accepted (_accept_resume)
        cfg = plan.cfg
    elif overrides:
        raise ConfigError("overrides without --resume belong in load_config (the config of a new run).")
    cfg = cfg if cfg is not None else load_config()
    if run is None:
        check_out_dir(cfg.out_dir)  # before any model work
    world = init_world(cfg.device, cfg.dist.timeout_s)  # started by torchrun: join the job; else nothing
    console = Console(run.log if run and world.is_main else None, quiet=quiet or not world.is_main,
                      buffer=world.is_main)
    with ExitStack() as owned, library_output_to_log(console):
        try:
            if run is not None:  # --resume: one writer per run directory (vagent.runs.lock)
                hold_run_dir(run.root, owned, console)
                if finished(run.root, not world.is_main or quiet, overrides):  # it finished while this one started
                    return run.root
            return _train(cfg, run, plan, console, t_start, owned, source)
        except BaseException as exc:
            if not is_disk_full(exc):
                if isinstance(exc, (ConfigError, TrainingError)) and not isinstance(exc, RunDirLocked):
                    console.log(f"error: {exc}")  # train.log (a locked one is another job's); the command prints it
                raise
            root = console.log_path.parent if console.log_path is not None else None  # the run directory
            err = disk_full_error(root or cfg.out_dir, exc, resume=root)
            console.log(f"error: {err}")  # train.log; the command prints it once, as it prints every error
            raise err from exc


def hold_run_dir(root: Path, owned: ExitStack, console: Console) -> None:
    """Rank 0 (or the one process) takes the run directory's lock until ``owned`` closes
    (:func:`vagent.runs.lock.lock_run_dir`); in a job every rank learns whether it could, and
    every rank raises :class:`~vagent.runs.lock.RunDirLocked` when a live process holds it."""
    world, refused = current_world(), None
    if world.is_main:
        try:
            owned.enter_context(lock_run_dir(root, say=console.print))
        except RunDirLocked as exc:
            refused = str(exc)
    if world.distributed:
        refused = broadcast_object(refused, "run directory lock")
    if refused is not None:
        raise RunDirLocked(refused)


def _train(cfg: RunConfig, run: RunDir | None, plan: Resume | None, console: Console, t_start: float,
           owned: ExitStack, source: ConfigSource | None = None) -> Path:
    """``train`` after the run directory to resume (if any) and the console are known; ``owned``
    holds the run directory's lock (a new run's is taken here, when the directory is made).
    Set-up (seeds, device, checkpoint to resume, model, run directory, loggers) -> SFT -> RL ->
    finish (loggers closed, plots, summary.json). ``plan``: the resume's (None: a new run)."""
    world, resuming = current_world(), plan is not None
    device, bf16 = _seed_and_device(cfg)
    latest = _accept_resume(run, plan, console) if run is not None and plan is not None else None
    model_dir, loaded = _checked_model(cfg, console, device)
    run = _open_run_dir(cfg, run, console, owned, source)
    logger = MetricsLogger(run.root, tensorboard=cfg.log.tensorboard, wandb=cfg.log.wandb,
                           wandb_project=cfg.log.wandb_project, run_name=run.root.name) if world.is_main else SilentLogger()
    _cut_metrics_back(logger, latest, resuming, console)
    console.print(*startup_arithmetic(cfg, run.root, count_parameters(loaded.model),
                                      count_parameters(loaded.model, trainable_only=True), world.size,
                                      int(os.environ.get("GROUP_WORLD_SIZE", "1")) if world.distributed else 1), "")
    session = Session(cfg, run, console, logger, device, bf16, loaded, model_dir)
    hub = start_hub_upload(cfg.hub, run.checkpoints, say=console.print) if world.is_main else None  # hub.repo_id
    try:
        _sft_then_rl(session, latest)
    finally:
        _stop(session, hub, failing=sys.exc_info()[1] is not None)  # a failure here must not hide that error
    if world.is_main:
        _write_summary(run, time.time() - t_start, world.size, console)
    return run.root


def _seed_and_device(cfg: RunConfig) -> tuple[torch.device, bool]:
    """Seed Python, NumPy and torch with the run seed, set the CPU threads; the device (several
    GPUs: cuda:LOCAL_RANK) and whether bf16 autocast is on."""
    random.seed(cfg.seed)
    np.random.seed(cfg.seed % 2**32)
    torch.manual_seed(cfg.seed)
    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
    device = resolve_device(rank_device(cfg.device))
    return device, use_bf16(cfg.bf16, device)


def _checked_model(cfg: RunConfig, console: Console, device: torch.device) -> tuple[Path, LoadedModel]:
    """The model directory and the loaded policy, after what the rollout needs (Ray for replicas,
    vLLM for engine vllm) and the remote envs are checked: a missing package, an impossible rollout
    setting or a missing model fails before a run directory exists, not after SFT."""
    check_rollout_setup(cfg.rollout, current_world().distributed)
    check_remote_envs(cfg, console.print)  # envs.N.urls: reachable, token accepted, env served
    try:
        model_dir = prepare_model_once(cfg, console)  # several processes: rank 0 builds, the others wait
    except Exception as exc:  # a full disk here is model.cache_dir's, not the output folder's
        if not is_disk_full(exc):
            raise
        cache = Path(cfg.model.cache_dir).expanduser()
        raise disk_full_error(cache, exc, what="the model build under model.cache_dir") from exc
    loaded = load_model(cfg, model_dir, device)
    check_compatible(loaded, cfg)
    return model_dir, loaded


def _open_run_dir(cfg: RunConfig, run: RunDir | None, console: Console, owned: ExitStack,
                  source: ConfigSource | None) -> RunDir:
    """A new run's directory (rank 0 writes it with run.json and config.yaml; train.log gets the
    lines printed so far) and its lock; then the config summary and, on rank 0, the environment
    record. ``run``: the resumed run's directory (None: a new run)."""
    world, resuming = current_world(), run is not None
    if run is None and world.is_main:  # rank 0 alone writes the run directory
        run = new_run_dir(cfg.out_dir, cfg.name)
        write_new_run_files(run, cfg)
        console.attach(run.log)  # with the lines printed so far (the model build's)
    if world.distributed:
        run = RunDir(Path(broadcast_object(str(run.root) if world.is_main and run is not None else "", "run directory")))
    assert run is not None, "rank 0 made the run directory (and a job's other ranks got it from rank 0)"
    if not resuming:
        hold_run_dir(run.root, owned, console)
    console.print(*config_summary(cfg, load_config(), run.config, source=source))
    if world.is_main:
        record_environment(run.root, say=console.print)  # threads, CPU kernels, versions (a resume compares)
    return run


def _accept_resume(run: RunDir, plan: Resume, console: Console) -> CheckpointInfo | None:
    """The checkpoint a resume continues from (None: none yet), chosen and accepted before any
    model work and before anything is written: rank 0 takes the newest intact one of this run
    (manifests, identities; a damaged or foreign one is named and skipped) and refuses one this
    job cannot continue (:func:`~vagent.recipes.resume.check_resumable`); only then are the
    resume's config change or identity written (:meth:`Resume.accept`) and killed saves' temporary
    folders deleted. A job's ranks all raise rank 0's refusal; the resume's own lines (a rebuilt
    identity, an accepted change) follow its acceptance."""
    world, latest, refused = current_world(), None, None
    if world.is_main:
        try:
            latest = select_checkpoint(run.checkpoints, say=console.print,
                                       run=plan.identity if plan.checks_identity else None)
            check_resumable(run, latest, plan, world.size)
            plan.accept()
            remove_stale_temporaries(run.checkpoints, say=console.print)
        except (ConfigError, CheckpointError) as exc:
            refused = exc
    if world.distributed:
        latest, refused = broadcast_object((latest, refused), "checkpoint to resume")
    if refused is not None:
        raise refused
    for line in plan.said:
        console.print(line)
    return latest


def _cut_metrics_back(logger: MetricsLogger | SilentLogger, latest: CheckpointInfo | None, resuming: bool, console: Console) -> None:
    """A resume: metrics.jsonl loses the records written after the checkpoint (all of them when
    there is none yet), and the console says where the run continues from."""
    torn = torn_last_record(logger.path) if resuming and isinstance(logger, MetricsLogger) else 0
    if torn and isinstance(logger, MetricsLogger):
        console.print(f"warning: the last record of {logger.path} was cut ({torn} bytes without a line end: the "
                      "process was killed or the disk filled while writing it); it is dropped")
    if latest is not None:
        dropped = logger.truncate_after(("sft", "rl"), latest.phase, latest.step)
        console.print(f"resuming from {latest.path} ({latest.phase} step {latest.step}); "
                      f"dropped {dropped} metric records written after it")
        written_by, ranks = checkpoint_ranks(latest.path), current_world().size
        if written_by != ranks:
            console.print(f"note: this checkpoint was written by {written_by} rank(s) and this job has {ranks}: "
                          "its tensors load exactly (re-sharded), but the steps after it sum their gradients in "
                          "another order, so the run continues equal to an uninterrupted one within float rounding, "
                          "not bit for bit (docs/distributed.md, 'Checkpoints')")
    elif resuming:
        logger.truncate_after(("sft", "rl"), "sft", 0)
        console.print("resuming: no checkpoint yet, starting over in the same run directory")


def _sft_then_rl(session: Session, latest: CheckpointInfo | None) -> None:
    """The SFT warm start (``sft.steps > 0``; skipped when a checkpoint has it done), then PPO or
    GRPO (``recipe``). An out-of-memory error becomes a TrainingError that names the fix for its
    phase; errors are said once, by the command (``train`` logs them to train.log)."""
    cfg = session.cfg
    phase = "setup"
    last = str(latest.path) if latest is not None else None  # the newest checkpoint, until SFT or RL writes one
    try:
        sft_done = latest is not None and (latest.phase == "rl" or latest.step >= cfg.sft.steps)
        if cfg.sft.steps > 0 and not sft_done:
            phase = "sft"
            start = latest.step if latest is not None else 0
            last = train_sft(session, start, resume_from=str(latest.path) if latest is not None else None)
        else:
            _restore_sft_result(session, latest)
        if cfg.recipe != "sft":
            phase = "rl"
            resumed = latest if latest is not None and latest.phase == "rl" else None
            train_rl = train_ppo if cfg.recipe == "ppo" else train_grpo
            # the newest checkpoint before RL (the resumed one, or SFT's last) until RL writes its own
            train_rl(session, resumed.step if resumed is not None else 0,
                     str(resumed.path) if resumed is not None else None, last_checkpoint=last)
    except (RuntimeError, MemoryError) as exc:
        if is_oom(exc):
            raise TrainingError(oom_message(phase, cfg)) from exc
        raise


def _restore_sft_result(session: Session, latest: CheckpointInfo | None) -> None:
    """A resume past SFT: an SFT checkpoint gives the policy its weights and RNG; an RL one needs
    the SFT result first, as the reference model and the critic's initial backbone are the SFT
    result in the uninterrupted run (the RL checkpoint then restores policy, critic and RNG)."""
    if latest is None:
        return
    policy = session.loaded.model
    if latest.phase == "sft":
        load_checkpoint(latest.path, {"policy": policy})
    elif session.cfg.sft.steps > 0:
        world, reference = current_world(), trained_from(latest.path)  # the SFT checkpoint RL trained from
        sft_ckpt = reference if reference is not None else (
            _newest_sft(session) if world.is_main else None)  # an older vagent's checkpoint names none
        if world.distributed and reference is None:
            sft_ckpt = broadcast_object(sft_ckpt, "SFT checkpoint")
        if sft_ckpt is not None:
            load_checkpoint(sft_ckpt, {"policy": policy})
        else:
            session.console.print("warning: no SFT checkpoint left in the run; the KL reference is the base model")


def _newest_sft(session: Session) -> Path | None:
    found = select_checkpoint(session.run.checkpoints, "sft", say=session.console.print)
    return found.path if found is not None else None


def _stop(session: Session, hub: HubUploader | None, failing: bool) -> None:
    """Close the hub upload (it uploads the last checkpoint if it is not up yet: a bounded wait) and
    the metrics logger, then plot (rank 0). While an error propagates (``failing``), a failure here
    is logged as a warning instead of hiding it."""
    run = session.run
    closing: list[tuple[str, Callable[[], object]]] = [("closing the metrics logger", session.logger.close)]
    if hub is not None:
        closing.insert(0, ("the hub upload", hub.close))
    if (session.cfg.log.plots and current_world().is_main and run.metrics.is_file()
            and not plots_current(run.metrics, run.plots)):
        closing.append(("plotting", lambda: plot_run(run.metrics, run.plots)))
    for what, close in closing:
        try:
            close()
        except Exception as exc:
            if not failing:
                raise
            session.console.log(f"warning: while stopping, {what} failed too: {type(exc).__name__}: {exc}")


def _write_summary(run: RunDir, wall_s: float, ranks: int, console: Console) -> None:
    """summary.json (written last: a run that has it is finished) and its lines on the console."""
    summary = summarize(run, wall_s, ranks=ranks)
    write_atomic(run.root / "summary.json", json.dumps(summary, indent=2) + "\n")
    console.print(format_summary(summary))


def checkpoint_ranks(path: str | Path) -> int:
    """How many ranks wrote a checkpoint (its state.pt's ``world_size``; 1 for a one-process one)."""
    from vagent.runs.safe_load import LEGACY_RNG, load_data

    state = load_data(Path(path) / "state.pt", LEGACY_RNG, mmap=True)  # data, never code (vagent.runs.safe_load)
    return int(state.get("world_size", 1)) if isinstance(state, dict) else 1


def summarize(run: RunDir, wall_s: float, ranks: int = 1) -> dict:
    """Key numbers of a run: validation success after SFT (RL step 0) and at the end, wall time,
    the job's ranks (processes)."""
    records = read_metrics(run.metrics)
    val = [r for r in records if r.get("phase") == "rl" and "val/success_rate" in r]
    sft = [r for r in records if r.get("phase") == "sft" and "sft/loss" in r]
    out: dict[str, Any] = {"run_dir": str(run.root), "wall_time_s": round(wall_s, 1), "ranks": ranks}
    if sft:
        out["sft_steps"] = len(sft)
        out["sft_final_loss"] = sft[-1]["sft/loss"]
    if val:
        out["val_success_start"] = val[0]["val/success_rate"]
        out["val_success_end"] = val[-1]["val/success_rate"]
        out["val_success_best"] = max(r["val/success_rate"] for r in val)
        out["val_curve"] = [[r["step"], r["val/success_rate"]] for r in val]
    return out


def format_summary(s: dict) -> str:
    ranks = s.get("ranks", 1)
    lines = [f"run directory: {s['run_dir']}",
             f"wall time: {s['wall_time_s'] / 60:.1f} min" + (f" on {ranks} ranks" if ranks > 1 else "")]
    if "sft_final_loss" in s:
        lines.append(f"SFT: {s['sft_steps']} steps, final loss {s['sft_final_loss']:.3f}")
    if "val_success_start" in s:
        start = "after SFT" if "sft_steps" in s else "before any update"
        lines.append(f"validation success: {s['val_success_start']:.3f} at RL step 0 ({start}) -> "
                     f"{s['val_success_end']:.3f} at the end (best {s['val_success_best']:.3f})")
    if any((Path(s["run_dir"]) / "plots").glob("*.png")):  # none with log.plots false
        lines.append(f"curves: {Path(s['run_dir']) / 'plots'}")
    return "\n".join(lines)
