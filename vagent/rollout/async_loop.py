"""The asynchronous schedule of the multi-turn rollout (``rollout(..., schedule="async")``).

The lockstep schedule (``vagent.rollout.loop``) waits, every turn, for the whole batch's replies
and then for every env step: the slowest env or reply holds every trajectory. Here each
trajectory runs in its own thread and advances as soon as ITS env step and ITS reply return:

    reset -> [conversation -> policy.act([conv]) -> env.step -> record] x turns -> close

Generation still runs in batches: the policy's engine must be thread-safe and merge concurrent
calls (``BatchingEngine`` in process, ``RemoteEngine`` replicas; ``HFPolicy.thread_safe``), so
the replies that are waiting while the engine is busy form the next batch.

Same episodes as lockstep. Every step of a trajectory is the same function as in lockstep
(:mod:`vagent.rollout.trajectory`: ``start_env``, ``next_conversation``, ``act`` with the same
turn seeds, ``apply_reply``, ``step_env``, ``record_turn``), and so is the end
(:func:`vagent.rollout.finish.finish_rollout`); only the batching differs. Greedy replies do not depend on the batch, so
greedy episodes equal lockstep's (tested); sampled ones do when every request carries its own seed
(``HFPolicy(per_request_seeds=True)``), which this schedule therefore requires of a sampling
``HFPolicy`` (batch-seeded draws would depend on the arrival order of the threads).

Timings differ in meaning: ``perf/generate_time_s`` and ``perf/env_time_s`` are summed over the
trajectories (they overlap), and ``perf/rollout_tokens_per_s`` divides by the rollout's wall time.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Mapping, Sequence

from vagent.rollout.finish import RolloutClock, RolloutResult, finish_rollout, judge_episodes
from vagent.rollout.policy import Policy, SamplingConfig
from vagent.rollout.records import Episode
from vagent.rollout.trajectory import (
    EnvFactory, EnvSpec, Live, act, apply_reply, check_args, close_env, new_lives, next_conversation, record_turn,
    start_env, step_env,
)


def _trajectory(live: Live, policy: Policy, sampling: SamplingConfig, max_turns: int, window: int | None,
                env_factory: EnvFactory | None, clock: RolloutClock) -> None:
    """One episode from reset to close, advancing on its own replies and env steps."""
    try:
        clock.timed("env", start_env, live, env_factory)
        for t in range(max_turns):
            if live.finished:
                break
            next_conversation(live, window)
            reply = clock.timed("gen", act, policy, [live], sampling, t)[0]
            if not apply_reply(live, reply, window):
                continue
            stepped = clock.timed("env", step_env, live, reply.text)
            if stepped is not None:
                record_turn(live, t, reply, stepped, max_turns, window)
    finally:
        close_env(live)


def _check_policy(policy: Policy, sampling: SamplingConfig) -> None:
    """The policy can be called from one thread per trajectory, with draws that do not depend on
    which requests share a batch."""
    if not getattr(policy, "thread_safe", False):
        raise TypeError(
            f"schedule='async' calls policy.act from one thread per trajectory, and this "
            f"{type(policy).__name__} is not thread-safe. Use HFPolicy(..., batching=True) (an in-process "
            "model behind a BatchingEngine) or an HFPolicy on a RemoteEngine, or schedule='lockstep'."
        )
    if sampling.temperature > 0 and hasattr(policy, "per_request_seeds") and not policy.per_request_seeds:
        raise ValueError("schedule='async' with sampling needs per-request seeds (a batch-seeded draw would "
                         "depend on which trajectories happened to share a batch): HFPolicy(..., "
                         "per_request_seeds=True)")


def _engine_stats(policy: Policy) -> dict[str, int] | None:
    """The engine's counters: those of the HFEngine behind a BatchingEngine, where there is one."""
    engine = getattr(policy, "engine", None)
    engine_stats = getattr(engine, "stats", None)
    inner = getattr(engine, "engine", None)
    if inner is not None:  # BatchingEngine(HFEngine)
        engine_stats = getattr(inner, "stats", engine_stats)
    return engine_stats


def rollout_async(
    env_specs: Sequence[EnvSpec],
    policy: Policy,
    sampling: SamplingConfig,
    *,
    group_size: int = 1,
    max_turns: int,
    mode: str = "concat",
    window: int | None = None,
    reasoning_reward: Callable[[list[Episode]], Mapping[str, float]] | None = None,
    env_factory: EnvFactory | None = None,
) -> RolloutResult:
    """``rollout(..., schedule="async")``: the same arguments and result (see the module docstring)."""
    window = check_args(env_specs, group_size, max_turns, mode, window, policy)
    _check_policy(policy, sampling)
    clock = RolloutClock(_engine_stats(policy))
    lives = new_lives(env_specs, group_size)
    with ThreadPoolExecutor(max_workers=max(1, len(lives))) as pool:
        futures = [pool.submit(_trajectory, lv, policy, sampling, max_turns, window, env_factory, clock)
                   for lv in lives]
        errors = [f.exception() for f in futures]
    first = next((e for e in errors if e is not None), None)
    if first is not None:
        raise first
    return judge_episodes(finish_rollout(lives, policy, clock, tokens_per="wall"), reasoning_reward)


__all__ = ["rollout_async"]
