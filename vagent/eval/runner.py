"""Run an evaluation: envs x seeds x models x formats through the training rollout, resumable.

``run_eval(cfg)`` does, in order:

1. expand the config into cells (env, format, model) and their seeds (named splits only);
2. for every expected episode, look for its record on disk (:mod:`vagent.eval.store`): a record
   with the same fingerprint (env config, format, model, sampling, turns, mode, judges) is
   finished and skipped; a record with a different fingerprint stops the run with a
   ``ConfigError`` (use ``force`` or a new ``out_dir``); errored records rerun when
   ``retry_errors``; ``force`` reruns everything;
3. per model, build its policy (:func:`vagent.eval.backends.make_policy`) and roll out the
   pending episodes with :func:`vagent.rollout.rollout` -- the very loop training uses, so the
   prompts, parsing and rewards are the training ones (docs/algorithms.md reference bug 9). API models run one
   rollout call per seed (``group_size`` episodes) in ``concurrency`` threads, all sharing the
   model's request semaphore; local (hf) models run ``batch_size`` episodes (``batch_size //
   group_size`` seeds) per call, one call at a time (batched generation). Each finished episode
   is written atomically at once, so a killed run loses at most the episodes in flight;
4. recompute ``summary.json`` from the records on disk, print the table, write ``report.html``.

Errors are never rewards: an API failure after retries, or an env exception, gives an episode
with ``error`` set (written, counted in ``errors``, excluded from success rates) -- and, with
``retry_errors``, rerun by the next invocation.
"""

from __future__ import annotations

import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from vagent.config import ConfigError, to_dict
from vagent.eval.config import EvalConfig, EvalEnv, ModelSpec, resolve_seeds, validate
from vagent.eval.report import error_headline, print_table, render_html, summarize_cell
from vagent.eval.store import EpisodeKey, atomic_write_bytes, atomic_write_json, episode_record, fingerprint, \
    read_episode, write_episode


@dataclass
class Cell:
    """One (env, format, model) combination with its seeds and the config that fixes its episodes."""

    env: EvalEnv
    format: str
    model: ModelSpec
    seeds: list[int]
    run_config: dict[str, Any]
    fingerprint: str

    @property
    def env_config(self) -> dict[str, Any]:
        return {**self.env.config, "format": self.format}

    def keys(self, group_size: int) -> list[EpisodeKey]:
        return [EpisodeKey(self.model.label, self.env.key, self.format, s, g)
                for s in self.seeds for g in range(group_size)]


@dataclass
class EvalResult:
    """What ``run_eval`` returns: the summary dict and the counts of this invocation."""

    summary: dict[str, Any]
    out_dir: Path
    ran: int = 0  # episodes rolled out by this invocation
    skipped: int = 0  # episodes already finished on disk
    api_stats: dict[str, dict[str, float]] = field(default_factory=dict)
    first_error: str | None = None  # the first errored episode's error line (cell order, then seed)


def _run_config(cfg: EvalConfig, env: EvalEnv, fmt: str, model: ModelSpec) -> dict[str, Any]:
    """What determines an episode (its fingerprint): not concurrency, timeouts, URLs or keys."""
    return {
        "env_name": env.name, "env_config": {**env.config, "format": fmt},
        "backend": model.backend, "model": model.model, "gguf_file": model.gguf_file,
        "stop_mode": model.stop_mode, "send_seed": model.send_seed, "restore_think": model.restore_think,
        "send_sampling": model.send_sampling,
        "max_context_tokens": model.max_context_tokens,
        "max_turns": cfg.max_turns, "mode": cfg.mode, "window": cfg.window,
        "sampling": to_dict(cfg.sampling), "reasoning_reward": dict(cfg.reasoning_reward),
    }


def expand_cells(cfg: EvalConfig) -> list[Cell]:
    """The cells of a config, in (model, env, format) order, validating env names and configs."""
    from vagent.envs import make_config

    cells = []
    for model in cfg.models:
        for env in cfg.envs:
            seeds = resolve_seeds(env.seeds or cfg.seeds, f"env {env.key} seeds")
            for fmt in cfg.formats:
                try:
                    make_config(env.name, **{**env.config, "format": fmt})
                except (KeyError, ConfigError) as exc:
                    raise ConfigError(f"eval config: env {env.key!r}: {exc}") from exc
                rc = _run_config(cfg, env, fmt, model)
                cells.append(Cell(env, fmt, model, seeds, rc, fingerprint(rc)))
    return cells


def _diff(a: Mapping[str, Any], b: Mapping[str, Any]) -> str:
    keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    return ", ".join(f"{k}: {a.get(k)!r} on disk vs {b.get(k)!r} now" for k in keys[:3]) or "(unknown)"


def plan(cfg: EvalConfig, cells: Sequence[Cell], out_dir: Path) -> tuple[dict[str, list[EpisodeKey]], int, int]:
    """(pending keys per model label, number already finished, number of errored records rerun)."""
    pending: dict[str, list[EpisodeKey]] = {m.label: [] for m in cfg.models}
    done = retry = 0
    for cell in cells:
        for key in cell.keys(cfg.group_size):
            rec = None if cfg.force else read_episode(out_dir, key)
            if rec is None:
                pending[key.model].append(key)
                continue
            if rec["fingerprint"] != cell.fingerprint:
                raise ConfigError(
                    f"{out_dir / key.json_path} was produced with a different config ({_diff(rec['run_config'], cell.run_config)}). "
                    "Use a new --out directory, or --force to overwrite the old episodes."
                )
            if rec.get("error") is not None and cfg.retry_errors:
                pending[key.model].append(key)
                retry += 1
            else:
                done += 1
    return pending, done, retry


def _make_reasoning_reward(mapping: Mapping[str, Any]) -> Any:
    """``vagent.rewards.ReasoningReward`` from its config mapping, or None when the mapping is empty."""
    if not mapping:
        return None
    from vagent.rewards import ReasoningReward

    return ReasoningReward(dict(mapping))  # validated there: unknown keys raise ConfigError


class _Locked:
    """Calls a (possibly stateful) reasoning reward under a lock: rollouts run in parallel threads."""

    def __init__(self, fn: Callable[[list], Mapping[str, float]]):
        self.fn, self.lock = fn, threading.Lock()

    def __call__(self, episodes: list) -> Mapping[str, float]:
        with self.lock:
            return self.fn(episodes)


class _Progress:
    """Prints one line at most every ``every_s`` seconds (and at the end)."""

    def __init__(self, total: int, label: str, stream: Any = sys.stderr, every_s: float = 2.0):
        self.total, self.label, self.stream, self.every_s = total, label, stream, every_s
        self.done = self.errors = 0
        self.t0 = self._last = time.perf_counter()
        self.lock = threading.Lock()

    def add(self, n: int, errors: int) -> None:
        with self.lock:
            self.done += n
            self.errors += errors
            now = time.perf_counter()
            if now - self._last >= self.every_s or self.done == self.total:
                self._last = now
                rate = self.done / max(now - self.t0, 1e-9) * 60
                print(f"[eval] {self.label}: {self.done}/{self.total} episodes, {self.errors} error(s), "
                      f"{rate:.1f} episodes/min", file=self.stream, flush=True)


def _run_model(cfg: EvalConfig, model: ModelSpec, keys: list[EpisodeKey], cells: dict[tuple[str, str], Cell],
               out_dir: Path, policy: Any, reasoning_reward: Any, progress: _Progress) -> None:
    """Roll out ``keys`` (all of one model) and write each episode as soon as its call returns."""
    from vagent.rollout import EnvSpec, rollout

    # Group keys by (cell, seed): one rollout spec each, group_size samples.
    groups: dict[tuple[str, str, int], list[EpisodeKey]] = {}
    for k in keys:
        groups.setdefault((k.env, k.format, k.seed), []).append(k)
    units = list(groups.items())
    per_call = max(1, model.batch_size // cfg.group_size) if model.backend == "hf" else 1
    parallel = 1 if model.backend == "hf" else model.concurrency
    calls = [units[i:i + per_call] for i in range(0, len(units), per_call)]
    window = cfg.window

    def run_call(call: list[tuple[tuple[str, str, int], list[EpisodeKey]]]) -> None:
        specs = []
        for (env_key, fmt, seed), _ in call:
            cell = cells[(env_key, fmt)]
            specs.append(EnvSpec(cell.env.name, cell.env_config, seed))
        # A group's samples are rolled out together (the rollout's group_size); when only some of
        # them are pending (an errored sample rerun), the others' new episodes are discarded.
        result = rollout(specs, policy, cfg.sampling, group_size=cfg.group_size, max_turns=cfg.max_turns,
                         mode=cfg.mode, window=window, reasoning_reward=reasoning_reward)
        n_err = n = 0
        for gi, ((env_key, fmt, seed), unit_keys) in enumerate(call):
            cell = cells[(env_key, fmt)]
            meta = {"run_config": cell.run_config, "fingerprint": cell.fingerprint, "backend": model.backend,
                    "model_id": model.model, "mode": cfg.mode}
            for key in unit_keys:  # only the pending samples of the group are written
                ep = result[gi * cfg.group_size + key.sample]
                write_episode(out_dir, episode_record(ep, key, meta, out_dir, cfg.save_images))
                n_err += ep.error is not None
                n += 1
        progress.add(n, n_err)

    if parallel == 1:
        for call in calls:
            run_call(call)
        return
    with ThreadPoolExecutor(max_workers=parallel, thread_name_prefix=f"eval-{model.label}") as pool:
        futures = {pool.submit(run_call, c) for c in calls}
        try:
            while futures:
                finished, futures = wait(futures, return_when=FIRST_COMPLETED)
                for f in finished:
                    f.result()  # re-raise a crash (a bug, not an API error: those are episode errors)
        except BaseException:
            for f in futures:
                f.cancel()
            raise


def collect(cfg: EvalConfig, cells: Sequence[Cell], out_dir: Path) -> tuple[dict[str, Any], dict]:
    """(summary, records per (env, model, format)) from the records on disk."""
    rows, records = [], {}
    for cell in cells:
        recs = [r for r in (read_episode(out_dir, k) for k in cell.keys(cfg.group_size)) if r is not None]
        recs = [r for r in recs if r["fingerprint"] == cell.fingerprint]
        records[(cell.env.key, cell.model.label, cell.format)] = recs
        rows.append(summarize_cell(recs, env=cell.env.key, model=cell.model.label, format=cell.format,
                                   backend=cell.model.backend, model_id=cell.model.model,
                                   expected=len(cell.seeds) * cfg.group_size, prices=cfg.prices))
    summary = {
        "schema": 1,
        "run": {"out_dir": str(out_dir), "max_turns": cfg.max_turns, "mode": cfg.mode, "window": cfg.window,
                "group_size": cfg.group_size, "sampling": to_dict(cfg.sampling),
                "envs": [{"label": e.key, "name": e.name, "config": dict(e.config)} for e in cfg.envs],
                "formats": list(cfg.formats), "training_run": dict(cfg.training_run),
                "reasoning_reward": bool(cfg.reasoning_reward), "finished_at": time.time(),
                "finished_at_text": time.strftime("%Y-%m-%d %H:%M:%S")},
        "cells": rows,
    }
    return summary, records


def _startup_lines(cfg: EvalConfig, cells: Sequence[Cell], pending: Mapping[str, list], done: int, retry: int,
                   out_dir: Path) -> list[str]:
    n_seeds = sorted({len(c.seeds) for c in cells})
    total = sum(len(c.seeds) for c in cells) * cfg.group_size
    todo = sum(len(v) for v in pending.values())
    lines = [
        f"[eval] {len(cfg.envs)} env(s) x {len(cfg.formats)} format(s) x {len(cfg.models)} model(s) x "
        f"{'/'.join(map(str, n_seeds))} seed(s) x group {cfg.group_size} = {total} episodes; "
        f"{done} finished on disk, {todo} to run{' (--force)' if cfg.force else ''}"
        + (f" ({retry} of them errored before: retry_errors)" if retry else ""),
        f"[eval] up to {cfg.max_turns} turns x {cfg.sampling.max_new_tokens} new tokens per episode; "
        f"mode {cfg.mode}{'' if cfg.window is None else f', window {cfg.window}'}; out {out_dir}",
    ]
    for m in cfg.models:
        how = (f"batch {m.batch_size}" if m.backend == "hf" else
               f"concurrency {m.concurrency}, {m.requests_per_minute or 'no'} req/min limit, {m.max_retries} retries")
        lines.append(f"[eval] model {m.label}: {m.backend} {m.model} ({how}): {len(pending[m.label])} to run")
    return lines


def run_eval(cfg: EvalConfig, *, policies: Mapping[str, Any] | None = None, stream: Any = sys.stderr) -> EvalResult:
    """Run (or resume) an evaluation; see the module docstring.

    Args:
        cfg: the evaluation config.
        policies: optional ready policies by model label (tests, or a policy already in memory);
            models without one get ``make_policy(spec)``.
        stream: where progress lines go.
    """
    validate(cfg)
    out_dir = Path(cfg.out_dir)
    cells = expand_cells(cfg)
    _remove_stale_tmp(out_dir)
    pending, done, retry = plan(cfg, cells, out_dir)
    for model in cfg.models:  # fail before anything is written or run, not when the model's turn comes
        if pending[model.label] and not (policies and model.label in policies):
            _check_reachable(model)
    out_dir.mkdir(parents=True, exist_ok=True)
    for line in _startup_lines(cfg, cells, pending, done, retry, out_dir):
        print(line, file=stream, flush=True)
    _save_config(cfg, out_dir)
    print(f"[eval] resolved config saved to {out_dir / 'config.yaml'}", file=stream, flush=True)
    judge = _make_reasoning_reward(cfg.reasoning_reward)
    judge = _Locked(judge) if judge is not None else None
    result = EvalResult(summary={}, out_dir=out_dir, skipped=done)
    for model in cfg.models:
        keys = pending[model.label]
        if not keys:
            continue
        mcells = {(c.env.key, c.format): c for c in cells if c.model.label == model.label}
        own = policies is not None and model.label in policies
        if own:
            policy = policies[model.label]
        else:
            from vagent.eval.backends import make_policy

            policy = make_policy(model)
        progress = _Progress(len(keys), model.label, stream)
        try:
            _run_model(cfg, model, keys, mcells, out_dir, policy, judge, progress)
        finally:
            stats = getattr(policy, "stats", None)
            if stats is not None:
                result.api_stats[model.label] = stats.as_dict()
            if not own and hasattr(policy, "close"):
                policy.close()
        result.ran += len(keys)
    summary, records = collect(cfg, cells, out_dir)
    summary["api"] = result.api_stats
    result.first_error = next((error_headline(r["error"]) for recs in records.values() for r in recs
                               if r.get("error") is not None), None)
    atomic_write_json(out_dir / "summary.json", summary)
    if cfg.html:
        page = render_html(summary, records, out_dir, cfg.html_max_episodes)
        atomic_write_bytes(out_dir / "report.html", page.encode("utf-8"))
    if cfg.print_table:
        print_table(summary)
    result.summary = summary
    return result


def _check_reachable(model: ModelSpec) -> None:
    """ConfigError (one line, naming the fix) if an API model has no key or an hf model's
    directory is missing or not a model directory (a hub id, OWNER/NAME, is looked up in the
    Hugging Face cache and downloaded when missing, as loading it would)."""
    if model.backend != "hf":
        model.resolved_api_key()
        return
    from vagent.models.loading import check_model_dir, resolve_model_path

    try:
        check_model_dir(resolve_model_path(model.model), model.gguf_file or None)
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise ConfigError(f"model '{model.label}' (hf): {exc}") from exc


def _remove_stale_tmp(out_dir: Path) -> None:
    """Delete temporary files a killed run left (``.<name>.tmp-<pid>``); one run per out_dir at a time."""
    episodes = out_dir / "episodes"
    if episodes.is_dir():
        for p in episodes.rglob(".*.tmp-*"):
            p.unlink(missing_ok=True)


def _save_config(cfg: EvalConfig, out_dir: Path) -> None:
    import yaml

    values = to_dict(cfg)
    for m in values["models"]:
        if m.get("api_key"):
            m["api_key"] = "<redacted>"
    atomic_write_bytes(out_dir / "config.yaml", yaml.safe_dump(values, sort_keys=False).encode("utf-8"))


__all__ = ["Cell", "EvalResult", "expand_cells", "plan", "collect", "run_eval"]
