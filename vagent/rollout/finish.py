"""The end of a rollout, shared by the lockstep and asynchronous schedules: the final observations
encoded for the critic's bootstrap, the reasoning rewards, :func:`rollout_metrics`, the ``perf/``
timings (:class:`RolloutClock`) and the engine's counters, gathered into a :class:`RolloutResult`.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Literal, Mapping, Sequence, TypeVar

from vagent.rollout.encoding import TokenPolicy
from vagent.rollout.policy import Message, Policy
from vagent.rollout.records import Episode
from vagent.rollout.trajectory import Live

logger = logging.getLogger(__name__)

T = TypeVar("T")


class RolloutResult(list):
    """The episodes (a ``list[Episode]``) plus ``metrics: dict[str, float]``."""

    def __init__(self, episodes: Sequence[Episode] = (), metrics: dict[str, float] | None = None):
        super().__init__(episodes)
        self.metrics: dict[str, float] = dict(metrics or {})



def engine_metrics(engine_stats: Mapping[str, int] | None, stats_before: Mapping[str, int] | None) -> dict[str, float]:
    """``perf/prompt_cache_frac`` (HFEngine prefix reuse) and ``rollout/engine_retries`` (requests
    sent again after their engine replica died) over this rollout, where the engine counts them
    (None: it counts nothing)."""
    if engine_stats is None or stats_before is None:
        return {}
    out = {}
    if "retried_requests" in engine_stats:
        out["rollout/engine_retries"] = float(engine_stats["retried_requests"] - stats_before.get("retried_requests", 0))
        dead = engine_stats.get("dead_replicas", 0) - stats_before.get("dead_replicas", 0)
        if dead:
            logger.warning("%d engine replica(s) died during this rollout; %d request(s) finished on the "
                           "others (rollout/engine_retries)", dead, int(out["rollout/engine_retries"]))
    if "retried_requests" not in engine_stats or "prompt_tokens" in engine_stats:
        prompt = engine_stats.get("prompt_tokens", 0) - stats_before.get("prompt_tokens", 0)
        reused = engine_stats.get("reused_tokens", 0) - stats_before.get("reused_tokens", 0)
        out["perf/prompt_cache_frac"] = reused / prompt if prompt > 0 else 0.0
    return out


def env_service_counters() -> dict[str, int] | None:
    """This process's env-service client counters (``vagent.service.transport.client_metrics``), or
    None when no remote env was used (the client module is not even imported)."""
    transport = sys.modules.get("vagent.service.transport")
    return None if transport is None else transport.client_metrics()


def env_service_metrics(before: Mapping[str, int] | None, after: Mapping[str, int] | None) -> dict[str, float]:
    """``rollout/env_replays`` (env sessions restored on a server by replay: theirs restarted, hung
    or was cut off) and ``rollout/env_failovers`` over this rollout, for runs with remote envs
    (``envs.N.urls``); a warning says when episodes moved."""
    if after is None:
        return {}
    before = before or {}
    replays = after.get("service/replays", 0) - before.get("service/replays", 0)
    failovers = after.get("service/failovers", 0) - before.get("service/failovers", 0)
    if replays:
        logger.warning("%d env session(s) were restored by replay on a live env server during this rollout "
                       "(their server restarted, hung past envs.N.timeout_s or was cut off; rollout/env_replays)",
                       replays)
    return {"rollout/env_replays": float(replays), "rollout/env_failovers": float(failovers)}


def encode_final_observations(episodes: list[Episode], policy: Policy) -> None:
    """Encode each truncated episode's final observation (token-level policies only)."""
    if not isinstance(policy, TokenPolicy):
        return
    for ep in episodes:
        if ep.error is None and ep.truncated and ep.final_observation is not None and ep.turns:
            obs = ep.final_observation
            ep.final_segment = policy.encode_message(Message("user", obs.text, obs.images))


def _mean(xs: Sequence[float]) -> float:
    return float(sum(xs) / len(xs)) if xs else 0.0


def rollout_metrics(episodes: Sequence[Episode]) -> dict[str, float]:
    """Summary metrics of a rollout (documented in docs/metrics/rollout.md).

    Rates are over episodes (or turns) WITHOUT error; ``rollout/errors`` counts the errored ones.
    ``action_valid_rate`` / ``effective_action_rate`` average ``info["action_is_valid"]`` /
    ``info["action_is_effective"]`` over the turns whose info has the key.
    """
    ok = [e for e in episodes if e.error is None]
    turns = [t for e in ok for t in e.turns]
    valid = [float(t.info["action_is_valid"]) for t in turns if "action_is_valid" in t.info]
    effective = [float(t.info["action_is_effective"]) for t in turns if "action_is_effective" in t.info]
    resp = [len(t.sampled_token_ids) or t.usage.get("completion_tokens", 0) for t in turns]
    return {
        "rollout/episodes": float(len(episodes)),
        "rollout/errors": float(len(episodes) - len(ok)),
        "rollout/error_frac": (len(episodes) - len(ok)) / len(episodes) if episodes else 0.0,
        "rollout/success_rate": _mean([float(e.success) for e in ok]),
        "rollout/return_mean": _mean([e.total_reward for e in ok]),
        "rollout/env_return_mean": _mean([e.env_return for e in ok]),
        "rollout/turns_mean": _mean([float(len(e.turns)) for e in ok]),
        "rollout/format_accuracy": _mean([float(t.parsed.format_ok) for t in turns]),
        "rollout/action_valid_rate": _mean(valid),
        "rollout/effective_action_rate": _mean(effective),
        "rollout/response_tokens_mean": _mean([float(x) for x in resp]),
        "rollout/finish_length_frac": _mean([float(t.finish_reason == "length") for t in turns]),
        "rollout/terminated_frac": _mean([float(e.terminated) for e in ok]),
        "rollout/truncated_frac": _mean([float(e.truncated) for e in ok]),
    }


@dataclass
class RolloutClock:
    """A rollout's start time, its generate and env seconds (summed over the threads that add
    them), and its engine's counters at the start (``engine_stats``: a dict the engine updates, or
    None when the engine counts nothing)."""

    engine_stats: dict[str, int] | None
    started: float = field(default_factory=time.perf_counter)
    gen: float = 0.0
    env: float = 0.0
    stats_before: dict[str, int] | None = field(init=False)
    #: the env-service client's counters at the start (None: no remote env in this process)
    service_before: dict[str, int] | None = field(init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        self.stats_before = dict(self.engine_stats) if isinstance(self.engine_stats, dict) else None
        self.service_before = env_service_counters()

    def timed(self, name: Literal["gen", "env"], fn: Callable[..., T], *args: object) -> T:
        """``fn(*args)``, its seconds added to ``name`` (thread-safe)."""
        t0 = time.perf_counter()
        out = fn(*args)
        seconds = time.perf_counter() - t0
        with self._lock:
            setattr(self, name, getattr(self, name) + seconds)
        return out


def finish_rollout(
    lives: Sequence[Live],
    policy: Policy,
    clock: RolloutClock,
    tokens_per: Literal["generate", "wall"],
) -> RolloutResult:
    """The episodes with their metrics: rollout_metrics, ``perf/`` timings
    (``perf/rollout_tokens_per_s`` per second of ``tokens_per``: generate time in lockstep, wall
    time when generation overlaps across threads) and the engine's counters."""
    episodes = [lv.episode for lv in lives]
    encode_final_observations(episodes, policy)
    metrics = rollout_metrics(episodes)
    wall = time.perf_counter() - clock.started
    n_tokens = sum(len(t.sampled_token_ids) for e in episodes for t in e.turns)
    seconds = clock.gen if tokens_per == "generate" else wall
    metrics.update({
        "perf/rollout_time_s": wall,
        "perf/generate_time_s": clock.gen,
        "perf/env_time_s": clock.env,
        "perf/rollout_tokens_per_s": n_tokens / seconds if seconds > 0 else 0.0,
    })
    metrics.update(engine_metrics(clock.engine_stats, clock.stats_before))
    metrics.update(env_service_metrics(clock.service_before, env_service_counters()))
    return RolloutResult(episodes, metrics)


def judge_episodes(result: RolloutResult,
                   reasoning_reward: Callable[[list[Episode]], Mapping[str, float]] | None) -> RolloutResult:
    """The reasoning-reward stage after a rollout: ``reasoning_reward`` (``vagent.rewards.ReasoningReward``:
    the judges) adds its rewards to the finished episodes' turns (errored episodes left out), and
    its metrics and seconds (``perf/judge_time_s``) join the result's; returns ``result``. None:
    nothing to do."""
    if reasoning_reward is None:
        return result
    t0 = time.perf_counter()
    judged = reasoning_reward([e for e in result if e.error is None]) or {}
    result.metrics.update({k: float(v) for k, v in judged.items()})
    result.metrics["perf/judge_time_s"] = time.perf_counter() - t0
    return result

