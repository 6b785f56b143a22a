"""Validation (greedy episodes on every env entry's val split) and the episode summaries logged
for training (``reward/*``) and validation (``val/*``). Validation shares the training rollout's
split over the ranks of a job (:func:`vagent.rollout.loop.rollout_on_ranks`).
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch

from vagent.recipes.common import sampling_for, val_env_specs
from vagent.rollout.loop import rollout_on_ranks
from vagent.rollout.records import Episode

if TYPE_CHECKING:
    from vagent.runconfig import RunConfig
    from vagent.rollout.policy import Policy
    from vagent.runs.progress import StepProgress


@dataclasses.dataclass
class Validation:
    """One validation point: its ``val/*`` metrics and every episode it played, in env-entry then
    seed order (errored ones included: the metrics leave them out)."""

    metrics: dict[str, float]
    episodes: list


def validation_turns(cfg: RunConfig) -> int:
    """The most lockstep turns a validation plays: the turn limit times the env entries it covers
    (the ``total`` of a validation progress display)."""
    return (cfg.val.max_turns or cfg.rollout.max_turns) * sum(e.n_val > 0 for e in cfg.envs)


def validation_rollout(policy: Policy, cfg: RunConfig, progress: StepProgress | None = None) -> Validation:
    """Greedy episodes on the ``val`` split of every env entry (the same seeds at every call).

    Metrics per env ``val/<env>/{success_rate, return, turns, format_accuracy}`` and over all
    val episodes ``val/{success_rate, return, turns, format_accuracy, time_s}``. ``progress``: a
    ``StepProgress`` over :func:`validation_turns` turns, updated after each turn.
    """
    t0 = time.perf_counter()
    greedy = sampling_for(cfg, 0, greedy=True)
    max_turns = cfg.val.max_turns or cfg.rollout.max_turns
    out: dict[str, float] = {}
    all_eps: list[Episode] = []
    played: list[Episode] = []
    names = [e.name for e in cfg.envs]
    done = 0
    for e in cfg.envs:
        if e.n_val <= 0:
            continue
        result = rollout_on_ranks(val_env_specs(e), policy, greedy, group_size=1, max_turns=max_turns,
                                  mode=cfg.rollout.mode, window=cfg.rollout.window,
                                  on_turn=_turn_progress(progress, done, max_turns, e.name))
        done += max_turns
        if progress is not None and progress.done < done:  # every episode ended before the turn limit
            progress.update(done, {"env": e.name, "running": 0})
        played += list(result)
        eps = [x for x in result if x.error is None]
        all_eps += eps
        key = e.name if names.count(e.name) == 1 else f"{e.name}{names.index(e.name)}"
        out.update({f"val/{key}/{k}": v for k, v in episode_summary(eps).items()})
    if all_eps:
        out.update({f"val/{k}": v for k, v in episode_summary(all_eps).items()})
    out["val/time_s"] = time.perf_counter() - t0
    return Validation(out, played)


def _turn_progress(progress: StepProgress | None, base: int, max_turns: int,
                   env: str) -> Callable[[int, int], None] | None:
    """``rollout``'s ``on_turn`` for a validation progress display (None without one)."""
    if progress is None:
        return None

    def on_turn(t: int, running: int) -> None:
        progress.update(base + (t if running else max_turns), {"env": env, "running": running})
    return on_turn


def validate(policy: Policy, cfg: RunConfig) -> dict[str, float]:
    """The ``val/*`` metrics of :func:`validation_rollout`."""
    return validation_rollout(policy, cfg).metrics


def episode_summary(eps: Sequence[Any]) -> dict[str, float]:
    n = max(1, len(eps))
    turns = [t for e in eps for t in e.turns]
    return {
        "success_rate": sum(e.success for e in eps) / n,
        "return": sum(e.total_reward for e in eps) / n,
        "turns": sum(len(e.turns) for e in eps) / n,
        "format_accuracy": sum(t.parsed.format_ok for t in turns) / max(1, len(turns)),
    }


def reward_metrics(episodes: Sequence[Any]) -> dict[str, float]:
    """``reward/*``: episode reward statistics of the training rollout (errored episodes left out)."""
    eps = [e for e in episodes if e.error is None]
    if not eps:
        return {}
    scores = torch.tensor([e.total_reward for e in eps])
    turn_r = [t.reward for e in eps for t in e.turns]
    reasoning = [sum(t.reasoning_rewards.values()) for e in eps for t in e.turns]
    return {
        "reward/mean": float(scores.mean()),
        "reward/std": float(scores.std(unbiased=False)),
        "reward/max": float(scores.max()),
        "reward/min": float(scores.min()),
        "reward/turn_mean": sum(turn_r) / max(1, len(turn_r)),
        "reward/reasoning_mean": sum(reasoning) / max(1, len(reasoning)),
    }
