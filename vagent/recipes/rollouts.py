"""The training rollout of an RL step, validation, and their summary metrics.

In a job of several ranks, :func:`rollout_on_ranks` gives rank r a contiguous block of the env
specs (a spec is one GRPO/GiGPO group, so a group stays whole on one rank and its statistics need
no gathering), samples with a rank-derived seed, and gathers every rank's episodes, renumbered to
the single-process group/trajectory ids and in spec order. Every rank then holds the whole batch:
advantages, whitening, filters and ``reward/*``, ``rollout/*`` and ``val/*`` metrics are computed
over the global batch exactly as in one process. The policy is unsharded once for the whole
rollout (:func:`vagent.distributed.generation_mode`), so decoding does not all-gather per token.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Any, Sequence

import torch

from vagent.distributed import gather_objects, generation_mode, world
from vagent.recipes.common import sampling_for, train_env_specs, val_env_specs
from vagent.recipes.optim import derive_seed
from vagent.recipes.session import Session
from vagent.rollout.finish import judge_episodes
from vagent.rollout.loop import EnvSpec, RolloutResult, rollout, rollout_metrics
from vagent.rollout.policy import SamplingConfig
from vagent.runs.errors import NonFiniteError, check_module_finite


def spec_blocks(n_specs: int, n_ranks: int) -> list[tuple[int, int]]:
    """[lo, hi) of the specs each rank plays: contiguous, sizes differing by at most one."""
    base, extra = divmod(n_specs, n_ranks)
    out, lo = [], 0
    for r in range(n_ranks):
        hi = lo + base + (1 if r < extra else 0)
        out.append((lo, hi))
        lo = hi
    return out


def rollout_on_ranks(specs: Sequence[EnvSpec], policy: Any, sampling: SamplingConfig, *, group_size: int = 1,
                     judge: Any = None, **kw: Any) -> RolloutResult:
    """``vagent.rollout.loop.rollout`` of ``specs``, shared between the ranks of a job (see the
    module docstring), then the reasoning-reward stage: ``judge`` (a ``ReasoningReward``, or None)
    scores each rank's own episodes (``judge_episodes``) before they are gathered. One process:
    ``judge_episodes(rollout(specs, ...), judge)``."""
    job = world()
    if not job.distributed:
        return judge_episodes(rollout(specs, policy, sampling, group_size=group_size, **kw), judge)
    lo, hi = spec_blocks(len(specs), job.size)[job.rank]
    mine = RolloutResult([], {})
    if hi > lo:  # ranks draw from different streams (the same seed would reuse one rank's noise)
        sampling = dataclasses.replace(sampling, seed=derive_seed(sampling.seed, "rank", job.rank))
        mine = judge_episodes(rollout(list(specs[lo:hi]), policy, sampling, group_size=group_size, **kw), judge)
    for ep in mine:  # the single-process ids: group = spec index, trajectory = group * size + member
        member = ep.traj_id - ep.group_id * group_size
        ep.group_id += lo
        ep.traj_id = ep.group_id * group_size + member
    parts = gather_objects((list(mine), mine.metrics), "rollout episodes")
    episodes = [ep for eps, _ in parts for ep in eps]
    metrics = rollout_metrics(episodes)
    n = [len(eps) for eps, _ in parts]
    for key in sorted({k for _, m in parts for k in m} - set(metrics)):
        vals = [(m[key], k) for (_, m), k in zip(parts, n) if key in m]
        if key.endswith("_time_s"):  # ranks roll out at the same time: the step waits for the slowest
            metrics[key] = max(v for v, _ in vals)
        else:  # episode-weighted mean (reasoning judges' means, prompt-cache fraction)
            metrics[key] = sum(v * k for v, k in vals) / max(1, sum(k for _, k in vals))
    # lockstep: generation time is wall time; async: it is summed over overlapping trajectories,
    # so the rate divides by the rollout's wall time (each the slowest rank's)
    clock = "perf/rollout_time_s" if kw.get("schedule") == "async" else "perf/generate_time_s"
    if clock in metrics:
        tokens = sum(len(t.sampled_token_ids) for e in episodes for t in e.turns)
        metrics["perf/rollout_tokens_per_s"] = tokens / max(1e-9, metrics[clock])
    return RolloutResult(episodes, metrics)


@dataclasses.dataclass
class Validation:
    """One validation point: its ``val/*`` metrics and every episode it played, in env-entry then
    seed order (errored ones included: the metrics leave them out)."""

    metrics: dict[str, float]
    episodes: list


def validation_turns(cfg: Any) -> int:
    """The most lockstep turns a validation plays: the turn limit times the env entries it covers
    (the ``total`` of a validation progress display)."""
    return (cfg.val.max_turns or cfg.rollout.max_turns) * sum(e.n_val > 0 for e in cfg.envs)


def validation_rollout(policy: Any, cfg: Any, progress: Any = None) -> Validation:
    """Greedy episodes on the ``val`` split of every env entry (the same seeds at every call).

    Metrics per env ``val/<env>/{success_rate, return, turns, format_accuracy}`` and over all
    val episodes ``val/{success_rate, return, turns, format_accuracy, time_s}``. ``progress``: a
    ``StepProgress`` over :func:`validation_turns` turns, updated after each turn.
    """
    t0 = time.perf_counter()
    greedy = sampling_for(cfg, 0, greedy=True)
    max_turns = cfg.val.max_turns or cfg.rollout.max_turns
    out: dict[str, float] = {}
    all_eps, played = [], []
    names = [e.name for e in cfg.envs]
    done = 0
    for e in cfg.envs:
        if e.n_val <= 0:
            continue
        eps = rollout_on_ranks(val_env_specs(e), policy, greedy, group_size=1, max_turns=max_turns,
                               mode=cfg.rollout.mode, window=cfg.rollout.window,
                               on_turn=_turn_progress(progress, done, max_turns, e.name))
        done += max_turns
        if progress is not None and progress.done < done:  # every episode ended before the turn limit
            progress.update(done, {"env": e.name, "running": 0})
        played += list(eps)
        eps = [x for x in eps if x.error is None]
        all_eps += eps
        key = e.name if names.count(e.name) == 1 else f"{e.name}{names.index(e.name)}"
        out.update({f"val/{key}/{k}": v for k, v in episode_summary(eps).items()})
    if all_eps:
        out.update({f"val/{k}": v for k, v in episode_summary(all_eps).items()})
    out["val/time_s"] = time.perf_counter() - t0
    return Validation(out, played)


def _turn_progress(progress: Any, base: int, max_turns: int, env: str) -> Any:
    """``rollout``'s ``on_turn`` for a validation progress display (None without one)."""
    if progress is None:
        return None

    def on_turn(t: int, running: int) -> None:
        progress.update(base + (t if running else max_turns), {"env": env, "running": running})
    return on_turn


def validate(policy: Any, cfg: Any) -> dict[str, float]:
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


def train_rollout(session: Session, policy: Any, step: int, reasoning: Any, unshard: bool = True) -> RolloutResult:
    """The training rollout of RL ``step`` (sampled, train-split seeds of the step). ``unshard``: the
    policy generates with the trainer's model, gathered once for the rollout when sharded (False
    for a separate generator: engine replicas or vLLM, which leave the trainer's parameters alone).
    If generation fails because the policy's weights hold NaN/inf, say so (NonFiniteError) instead
    of a sampler error."""
    cfg = session.cfg
    try:
        with generation_mode(session.loaded.model) if unshard else contextlib.nullcontext():
            return rollout_on_ranks(train_env_specs(cfg, step), policy, sampling_for(cfg, step),
                                    group_size=cfg.rollout.group_size, max_turns=cfg.rollout.max_turns,
                                    mode=cfg.rollout.mode, window=cfg.rollout.window, judge=reasoning,
                                    schedule=cfg.rollout.schedule)
    except RuntimeError as exc:
        check_module_finite(session.loaded.model, "policy weights", "rl", step, session.last_checkpoint)
        if "inf" in str(exc).lower() or "nan" in str(exc).lower():
            raise NonFiniteError("the policy's next-token probabilities during the rollout (the weights are "
                                 "finite but the forward pass overflowed)", float("nan"), "rl", step,
                                 session.last_checkpoint) from exc
        raise
