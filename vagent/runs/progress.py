"""What a run prints: the config summary, the start-up arithmetic, one progress display per phase.

Everything printed also goes to ``train.log`` in the run directory; what is printed before the
run directory exists (the tiny model's build and caption pretraining) is kept and written to
``train.log`` when it is attached. Every long phase (caption pretraining, demonstrations, SFT,
PPO / GRPO) shows one :class:`StepProgress`: a rich bar with ETA on a terminal, plain lines with
ETA otherwise (CI, a subprocess, ``| tee``), and the plain lines in ``train.log`` either way.
While a run runs, Python warnings and the log messages of ``transformers`` / ``huggingface_hub``
go to ``train.log`` only, and their own progress bars are off (:func:`library_output_to_log`);
``vagent eval`` sends them to a file of its output folder the same way (:func:`library_output_to_file`).
"""

from __future__ import annotations

import math
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping

from vagent.runs.identity import flatten

if TYPE_CHECKING:
    from vagent.runconfig import RunConfig


class Console:
    """Prints to stdout and appends to the run's ``train.log``.

    Lines printed while ``log_path`` is None are kept (``buffer``) and written by :meth:`attach`.
    A console is also a ``say(text)`` callable, so code that reports through ``say`` can be
    handed the console itself (and then shows a progress bar on a terminal)."""

    def __init__(self, log_path: str | Path | None = None, quiet: bool = False, buffer: bool = True):
        self.log_path = Path(log_path) if log_path else None
        self.quiet = quiet
        self.buffer = buffer
        self.pending: list[str] = []

    def __call__(self, text: str) -> None:
        self.print(text)

    def print(self, *lines: str) -> None:
        text = "\n".join(lines)
        if not self.quiet:
            print(text, flush=True)
        self.log(text)

    def log(self, text: str) -> None:
        """Write ``text`` to ``train.log`` only (kept until :meth:`attach` while there is none)."""
        if self.log_path is not None:
            try:
                with open(self.log_path, "a") as f:
                    f.write(text + "\n")
            except OSError as exc:  # a full disk: the error that follows says so; the console still shows it
                from vagent.runs.errors import is_disk_full

                if not is_disk_full(exc):
                    raise
        elif self.buffer:
            self.pending.append(text)

    def attach(self, log_path: str | Path) -> None:
        """Log to ``log_path`` from now on, first appending what was printed before."""
        self.log_path = Path(log_path)
        pending, self.pending = self.pending, []
        for text in pending:
            self.log(text)


@dataclass(frozen=True)
class ConfigSource:
    """Where a run's config came from: ``vagent train --config FILE [--smoke] key=value ...``."""

    #: the YAML file (None: the default preset)
    file: str | None = None
    overrides: tuple[str, ...] = ()
    #: the overrides ``--smoke`` applied between the file and ``overrides`` (configs/paper/smoke.yaml;
    #: vagent.recipes.scale.smoke_overrides); empty: not a smoke run
    smoke: tuple[str, ...] = ()

    def keys(self) -> list[str]:
        """The dotted keys the file and the overrides set (``envs.0.config.size``), in order."""
        import yaml

        keys = list(flatten(yaml.safe_load(Path(self.file).read_text()) or {})) if self.file else []
        keys += self.override_keys()
        return list(dict.fromkeys(keys))

    def override_keys(self) -> list[str]:
        """The dotted keys the command line's overrides set."""
        from vagent.runconfig import parse_override

        return [".".join(parse_override(o)[0]) for o in self.overrides]

    def smoke_keys(self) -> list[str]:
        """The dotted keys whose value ``--smoke`` set (the command line's overrides win over it)."""
        from vagent.runconfig import parse_override

        given = set(self.override_keys())
        return [k for k in dict.fromkeys(".".join(parse_override(o)[0]) for o in self.smoke) if k not in given]


def _under(key: str, keys: list[str]) -> bool:
    return any(key == g or key.startswith(g + ".") for g in keys)


def config_summary(cfg: RunConfig, default: RunConfig, config_path: str | Path, width: int = 110, max_lines: int = 4,
                   source: ConfigSource | None = None) -> list[str]:
    """A few lines instead of the whole resolved config: where it is written and the keys where
    ``cfg`` differs from ``default`` (the default preset; ``key=value``, dotted as in overrides).
    With a config file (``source.file``), the keys the file and the overrides set, with their
    values: the fields it left to their defaults are not its changes. A smoke run
    (``source.smoke``) says so and lists the values ``--smoke`` set apart (they are not the file's)."""
    from vagent.config import to_dict

    now, base = flatten(to_dict(cfg)), flatten(to_dict(default))
    smoke = source.smoke_keys() if source is not None and source.smoke else []
    smoking = bool(source is not None and source.smoke)
    lines = [f"config: {config_path} (resolved; {cfg.recipe}, seed {cfg.seed}, model {cfg.model.path}"
             + (", smoke mode: --smoke)" if smoking else ")")]
    if smoke:
        items = [f"{k}={_short(v)}" for k, v in now.items() if _under(k, smoke)]
        lines += _wrapped(f"  smoke mode: {len(items)} set by --smoke (configs/paper/smoke.yaml):", items, width, 3)
    if source is not None and source.file:
        given = source.keys()
        changed = [f"{k}={_short(v)}" for k, v in now.items() if _under(k, given) and not _under(k, smoke)]
        by = source.file + (f" and {len(source.overrides)} override(s)" if source.overrides else "")
        if not changed:
            return lines + [f"  0 set by {by}"]
        return lines + _wrapped(f"  {len(changed)} set by {by}:", changed, width, max_lines - 1)
    changed = [f"{k}={_short(v)}" for k, v in now.items()
               if (k not in base or base[k] != v) and not _under(k, smoke)]
    changed += [f"{k}=(unset)" for k in base if k not in now]
    if not changed:
        return lines + ["  the default preset, unchanged"]
    return lines + _wrapped(f"  {len(changed)} changed from the default preset:", changed, width, max_lines - 1)


def _wrapped(title: str, items: list[str], width: int, max_lines: int) -> list[str]:
    """``title`` then the items, wrapped at ``width`` into at most ``max_lines`` lines; one more
    line says how many items did not fit."""
    lines: list[str] = []
    line = title
    for i, item in enumerate(items):
        if len(line) + len(item) + 1 > width:
            if len(lines) + 1 == max_lines:
                return lines + [line, f"  ... and {len(items) - i} more (see config.yaml)"]
            lines.append(line)
            line = "   "
        line += f" {item}"
    return lines + [line]


def _short(v: object, limit: int = 40) -> str:
    text = {True: "true", False: "false", None: "null"}.get(v, str(v)) if v is None or isinstance(v, bool) else str(v)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def startup_arithmetic(cfg: RunConfig, run_root: str | Path, n_params: int | None = None,
                       n_trainable: int | None = None, ranks: int = 1, nodes: int = 1) -> list[str]:
    """The numbers a reader checks before waiting (STYLE practice 5); ``ranks``: the processes of
    the job (``nodes`` hosts), and a warning when PPO's critic warm-up leaves the actor untrained."""
    r = cfg.rollout
    envs = sum(e.n_train for e in cfg.envs)
    episodes = envs * r.group_size
    samples = episodes * (r.max_turns if r.mode == "no_concat" else 1)
    max_sampled = episodes * r.max_turns * r.max_new_tokens
    lines = [f"run directory: {run_root}"]
    if ranks > 1:
        where = f"{nodes} nodes x {ranks // nodes}" if nodes > 1 else "1 node"
        lines.append(f"ranks: {ranks} ({where}, torchrun); rank 0 writes the run directory")
    else:
        lines.append("ranks: 1 (one process)")
    if n_params is not None:
        lines.append(f"model: {cfg.model.path} ({n_params / 1e6:.2f}M params, {(n_trainable or n_params) / 1e6:.2f}M trainable)")
    if cfg.sft.steps:
        src = cfg.sft.data or f"solver demos ({cfg.sft.demos_per_env} per env, {cfg.sft.random_action_frac:.0%} random actions)"
        lines.append(f"SFT: {cfg.sft.steps} steps x {cfg.sft.batch_size} chats from {src}, lr {cfg.sft.lr:g}")
    if cfg.recipe != "sft":
        lines += [
            f"{cfg.recipe.upper()}: {cfg.steps} steps; each: {envs} envs x group {r.group_size} = {episodes} episodes "
            f"({r.mode}: {samples} samples at most)",
            f"tokens: up to {r.max_turns} turns x {r.max_new_tokens} new tokens = {r.max_turns * r.max_new_tokens} "
            f"sampled per episode, {max_sampled} per step",
            f"update: {cfg.update.epochs} epochs x {cfg.update.mini_batches} mini-batches, micro-batches of "
            f"<= {cfg.update.micro_batch_tokens} tokens (a longer row alone); actor lr {cfg.update.actor_lr:g}",
            validation_line(cfg),
        ]
    warmup = cfg.ppo.critic_warmup_steps if cfg.recipe == "ppo" else 0
    if warmup and cfg.steps <= warmup:
        lines.append(f"warning: ppo.critic_warmup_steps={warmup} >= steps={cfg.steps}: the actor (the policy) is "
                     "not updated in any step of this run, only the critic. Set steps above "
                     f"{warmup}, or ppo.critic_warmup_steps below {cfg.steps}.")
    elif warmup:
        span = f"steps 1-{warmup} train" if warmup > 1 else "step 1 trains"
        lines.append(f"critic warm-up: RL {span} the critic only; the actor updates from step {warmup + 1} on")
    return lines


def validation_line(cfg: RunConfig) -> str:
    """What validation the run does: ``validation: off (val.every=0)``, or how often and on what."""
    if cfg.val.every == 0:
        return "validation: off (val.every=0)"
    return (f"validation: every {cfg.val.every} steps on " + ", ".join(f"{e.n_val} {e.name}" for e in cfg.envs)
            + " val-split episodes (greedy)")


def _fmt(v: object) -> str:
    if isinstance(v, float):
        return f"{v:.3g}"
    return str(v)


def format_duration(seconds: float) -> str:
    """``42s``, ``3m05s``, ``1h02m``."""
    s = int(round(max(0.0, seconds)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class StepProgress:
    """Progress over ``total`` steps of one phase, with ETA and a few metrics.

    ``console``: a :class:`Console` (a rich bar on a terminal when ``enabled``; plain lines
    otherwise; plain lines in ``train.log`` always) or any ``say(text)`` callable (plain lines).
    Plain lines come every ``every`` steps (default: total / :attr:`LINES`, so about 10 lines a
    phase), at the last step, and after ``interval_s`` (5 min) without one, so that a log shows a
    slow phase is alive without a line per step. Steps are counted as done: ``update(k)``
    after the k-th step of the phase (1..total); ``start`` steps were done before (a resume)."""

    #: plain lines per phase (when ``every`` is not given)
    LINES = 10

    def __init__(self, total: int, description: str, console: Console | Callable[[str], None],
                 enabled: bool = True, start: int = 0, every: int | None = None, interval_s: float = 300.0):
        self.total, self.description, self.console = total, description, console
        self.every = every or max(1, math.ceil(total / self.LINES))
        self.interval_s = interval_s
        self.start_time = self._last_time = time.time()
        self.done = self.first = self._last_line = start
        self._bar = None
        self._task = None
        tty = isinstance(console, Console) and not console.quiet and sys.stdout.isatty()
        if enabled and tty and total > 0:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

            self._bar = Progress(
                TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                TextColumn("{task.fields[metrics]}"),
            )
            self._bar.start()
            self._task = self._bar.add_task(description, total=total, completed=start, metrics="")

    def eta_s(self) -> float:
        """Seconds left at the mean pace of the steps done in this process."""
        per = (time.time() - self.start_time) / max(1, self.done - self.first)
        return per * (self.total - self.done)

    def line(self, metrics: Mapping[str, Any] | None = None) -> str:
        text = "  ".join(f"{k.split('/')[-1]}={_fmt(v)}" for k, v in (metrics or {}).items())
        elapsed = time.time() - self.start_time
        return (f"{self.description} {self.done}/{self.total} [{format_duration(elapsed)}, "
                f"ETA {format_duration(self.eta_s())}] {text}").rstrip()

    def update(self, done: int, metrics: Mapping[str, Any] | None = None) -> None:
        """Mark ``done`` steps (1..total) as done and show ``metrics``."""
        self.done = done
        now = time.time()
        due = (done >= self.total or done - self._last_line >= self.every
               or now - self._last_time >= self.interval_s)
        if self._bar is not None:
            text = "  ".join(f"{k.split('/')[-1]}={_fmt(v)}" for k, v in (metrics or {}).items())
            self._bar.update(self._task, completed=done, metrics=text)
        if not due:
            return
        self._last_line, self._last_time = done, now
        line = self.line(metrics)
        if self._bar is not None and isinstance(self.console, Console):
            self.console.log(line)  # the bar shows it on the terminal
        elif isinstance(self.console, Console):
            self.console.print(line)
        else:
            self.console(line)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


@contextmanager
def library_output_to_log(console: Console | Callable[[str], None]) -> Iterator[None]:
    """Within the block, Python warnings (``FutureWarning`` and the like) and the records of the
    ``transformers`` and ``huggingface_hub`` loggers go to ``console.log`` (``train.log``; or to
    ``console(text)`` when it is a plain callable) instead of the terminal, vagent's own warnings
    (``vagent.*`` loggers: a replica that died, a stuck one killed) to ``console.print`` (the
    terminal unless quiet, and ``train.log``) as ``warning: ...``, and the tqdm bars of
    transformers / huggingface_hub (weight loading, shard writing) are off; everything is restored
    on exit."""
    import logging
    import warnings

    from transformers.utils import logging as hf_logging

    write = console.log if isinstance(console, Console) else console

    def show(message, category, filename, lineno, file=None, line=None):  # noqa: ANN001 (warnings' signature)
        write(f"{category.__name__}: {message} ({filename}:{lineno})")

    class ToLog(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            write(f"{record.name} {record.levelname.lower()}: {record.getMessage()}")

    class ToConsole(logging.Handler):  # vagent's own warnings (a replica died): the terminal and train.log
        def emit(self, record: logging.LogRecord) -> None:
            say = console.print if isinstance(console, Console) else write
            say(f"{record.levelname.lower()}: {record.getMessage()}")

    own, own_handler = logging.getLogger("vagent"), ToConsole(level=logging.WARNING)
    own.addHandler(own_handler)
    handler = ToLog(level=logging.WARNING)
    loggers = [logging.getLogger(n) for n in ("transformers", "huggingface_hub")]
    saved = [(lg.handlers[:], lg.propagate) for lg in loggers]
    hf_logging.get_verbosity()  # sets up transformers' own handler now, so that it is the one replaced
    bars = hf_logging.is_progress_bar_enabled()
    show_before = warnings.showwarning
    warnings.showwarning = show
    hf_logging.disable_progress_bar()
    for lg in loggers:
        lg.handlers = [handler]
        lg.propagate = False
    try:
        yield
    finally:
        own.removeHandler(own_handler)
        warnings.showwarning = show_before
        for lg, (handlers, propagate) in zip(loggers, saved):
            lg.handlers, lg.propagate = handlers, propagate
        if bars:
            hf_logging.enable_progress_bar()


@contextmanager
def library_output_to_file(path: str | Path) -> Iterator[None]:
    """:func:`library_output_to_log` for a command without a run directory's Console (``vagent
    eval``): the libraries' warnings and messages are appended to ``path`` (its folder made at the
    first line; no file when there is none), their loading bars are off, the console keeps the
    command's own lines."""
    path = Path(path)

    def append(text: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as f:
            f.write(text + "\n")

    with library_output_to_log(append):
        yield
