"""The asynchronous schedule of the multi-turn rollout (``rollout(..., schedule="async")``).

The lockstep schedule (``vagent.rollout.loop``) waits, every turn, for the whole batch's replies
and then for every env step: the slowest env or reply holds every trajectory. Here each
trajectory runs in its own thread and advances as soon as ITS env step and ITS reply return:

    reset -> [conversation -> policy.act([conv]) -> env.step -> record] x turns -> close

Generation still runs in batches: the policy's engine must be thread-safe and merge concurrent
calls (``BatchingEngine`` in process, ``RemoteEngine`` replicas; ``HFPolicy.thread_safe``), so
the replies that are waiting while the engine is busy form the next batch.

Same episodes as lockstep. Every step of a trajectory is the same function as in lockstep
(``_start``, ``_next_conversation``, ``_step``, ``_record``, the same turn seeds
``_turn_seed(seed, t)``); only the batching differs. Greedy replies do not depend on the batch, so
greedy episodes equal lockstep's (tested); sampled ones do when every request carries its own seed
(``HFPolicy(per_request_seeds=True)``), which this schedule therefore requires of a sampling
``HFPolicy`` (batch-seeded draws would depend on the arrival order of the threads).

Timings differ in meaning: ``perf/generate_time_s`` and ``perf/env_time_s`` are summed over the
trajectories (they overlap), and ``perf/rollout_tokens_per_s`` divides by the rollout's wall time.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Mapping, Sequence

from vagent.rollout.trajectory import (
    EnvSpec, RolloutResult, _check_args, _close, _encode_final_observations, _engine_metrics, _Live,
    _next_conversation, _record, _start, _step, _turn_seed, rollout_metrics,
)
from vagent.rollout.policy import Message, Policy, SamplingConfig
from vagent.rollout.records import Episode


class _Timers:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.gen = self.env = 0.0

    def add(self, name: str, seconds: float) -> None:
        with self.lock:
            setattr(self, name, getattr(self, name) + seconds)


def _apply_reply(live: _Live, reply: Any, window: int | None) -> bool:
    """Handle a reply as the lockstep loop does; True when the env should be stepped with it."""
    if reply.error is not None or reply.finish_reason == "error":
        live.episode.error = f"policy: {reply.error or 'finish_reason=error'}"
        live.done = True
        return False
    if reply.finish_reason == "context_limit":
        if len(live.conv.segments) != live.n_segments_before:
            raise RuntimeError("a policy that hit its context limit must not append segments")
        live.conv.messages.pop()  # the unanswered observation becomes final_observation
        if window is not None:
            live.episode.samples.pop()
        live.episode.truncated, live.episode.final_observation, live.done = True, live.obs, True
        return False
    live.conv.messages.append(Message("assistant", reply.text))
    return True


def _trajectory(live: _Live, spec: EnvSpec, policy: Any, sampling: SamplingConfig, max_turns: int,
                window: int | None, env_factory: Any, timers: _Timers) -> None:
    """One episode from reset to close, advancing on its own replies and env steps."""
    needs_envs = bool(getattr(policy, "needs_envs", False))
    try:
        t0 = time.perf_counter()
        _start(live, spec, env_factory)
        timers.add("env", time.perf_counter() - t0)
        for t in range(max_turns):
            if live.done:
                break
            _next_conversation(live, window)
            sampling_t = dataclasses.replace(sampling, seed=_turn_seed(sampling.seed, t))
            t0 = time.perf_counter()
            if needs_envs:
                replies = policy.act([live.conv], sampling_t, envs=[live.env])
            else:
                replies = policy.act([live.conv], sampling_t)
            timers.add("gen", time.perf_counter() - t0)
            if len(replies) != 1:
                raise RuntimeError(f"policy.act returned {len(replies)} replies for 1 conversation")
            if not _apply_reply(live, replies[0], window):
                continue
            t0 = time.perf_counter()
            stepped = _step(live, replies[0].text)
            timers.add("env", time.perf_counter() - t0)
            if stepped is not None:
                _record(live, t, replies[0], stepped, max_turns, window)
    finally:
        _close(live)


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
    env_factory: Callable[[EnvSpec], Any] | None = None,
) -> RolloutResult:
    """``rollout(..., schedule="async")``: the same arguments and result (see the module docstring)."""
    window = _check_args(env_specs, group_size, max_turns, mode, window, policy)
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
    t_start = time.perf_counter()
    engine_stats = getattr(getattr(policy, "engine", None), "stats", None)
    if getattr(getattr(policy, "engine", None), "engine", None) is not None:  # BatchingEngine(HFEngine)
        engine_stats = getattr(policy.engine.engine, "stats", engine_stats)
    stats_before = dict(engine_stats) if isinstance(engine_stats, dict) else None
    lives, specs = [], []
    for gi, spec in enumerate(env_specs):
        for g in range(group_size):
            ep = Episode(env_name=spec.name, env_config=dict(spec.config), seed=int(spec.seed), group_id=gi,
                         traj_id=gi * group_size + g, system_prompt="")
            lives.append(_Live(ep))
            specs.append(spec)
    timers = _Timers()
    with ThreadPoolExecutor(max_workers=max(1, len(lives))) as pool:
        futures = [pool.submit(_trajectory, lv, spec, policy, sampling, max_turns, window, env_factory, timers)
                   for lv, spec in zip(lives, specs)]
        errors = [f.exception() for f in futures]
    first = next((e for e in errors if e is not None), None)
    if first is not None:
        raise first
    episodes = [lv.episode for lv in lives]
    _encode_final_observations(episodes, policy)
    metrics = rollout_metrics(episodes)
    if reasoning_reward is not None:
        metrics.update({k: float(v) for k, v in (reasoning_reward([e for e in episodes if e.error is None]) or {}).items()})
    wall = time.perf_counter() - t_start
    n_tokens = sum(len(t.sampled_token_ids) for e in episodes for t in e.turns)
    metrics.update({
        "perf/rollout_time_s": wall,
        "perf/generate_time_s": timers.gen,
        "perf/env_time_s": timers.env,
        "perf/rollout_tokens_per_s": n_tokens / wall if wall > 0 else 0.0,
    })
    if isinstance(engine_stats, dict):
        metrics.update(_engine_metrics(engine_stats, stats_before))
    return RolloutResult(episodes, metrics)


__all__ = ["rollout_async"]
