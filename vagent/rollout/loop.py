"""The multi-turn rollout: envs x group size episodes, one batched policy call per turn.

``rollout(env_specs, policy, sampling, group_size=G, max_turns=T, mode=...)`` runs every
:class:`EnvSpec` ``G`` times (one group: same env, seed and config; ``group_id`` = the spec's
index, ``traj_id`` = ``spec_index * G + g``, unique). Each turn:

1. every active episode gets the conversation of its next sample (see *Context modes*);
2. ``policy.act(conversations, sampling_t)`` is called ONCE for all active episodes, with
   ``sampling_t.seed = sampling.seed * 1_000_003 + t`` (so a turn's draws depend only on the
   base seed, the turn and the batch, never on how many rollouts the policy ran before);
3. all envs step concurrently in a thread pool (envs may be remote), each recording
   ``state_before = env.state()``, ``env.step(reply.text)``, ``state_after = env.state()``;
4. a :class:`Turn` is recorded.

An episode ends when the env says ``terminated`` or ``truncated``, or after ``max_turns`` turns
(then ``Episode.truncated = True``: a limit, not a terminal state); ``final_observation`` keeps
the observation after the last step, and token-level policies encode it in
``Episode.final_segment`` for the critic's bootstrap. ``Turn.truncated`` is the env's own flag.

Failures are errors, never rewards (docs/algorithms.md reference bug 8): a ``Reply.error`` marks the episode
``error = "policy: ..."`` and stops it without stepping the env; an exception in
``reset``/``step``/``state`` marks it ``error = "env: <traceback>"``. Errored episodes are kept in
the returned list (counted in ``rollout/errors``) and excluded by ``build_token_batch``. A reply
with ``finish_reason == "context_limit"`` (the policy's context limit would be exceeded) ends the
episode as truncated before that turn, with the unanswered observation as ``final_observation``.

Parsed replies: envs are authoritative. If ``info["parsed"]`` is a ``ParsedResponse`` (or its
dict, from a remote env), ``Turn.parsed`` is that; otherwise the loop parses the reply with
``vagent.envs.formats.parse_response`` and the env's ``config.format`` /
``config.max_actions_per_turn`` and ``action_sep`` (attribute of the env or its config).

Context modes (docs/algorithms.md reference section 4):

- ``mode="concat"`` (window None): one Conversation per episode holding the whole history
  ``[system][obs_0][act_0][obs_1][act_1]...``; one training row per episode.
- ``mode="concat", window=k``: each turn is its own sample whose context is the system prompt,
  the last ``k`` completed turns (observation + reply) and the current observation; one training
  row per turn, so the training context equals the rollout context (legacy rolled out windowed
  but trained on the full history). Earlier replies appear as mask-0 copies of their sampled
  token ids (never re-encoded); whole turns are dropped, so an image never loses its tokens.
- ``mode="no_concat"``: each turn's context is the system prompt plus the current observation
  (= ``window=0``); one row per turn.

``Episode.samples`` holds the sample conversations (one, or one per turn). For token-level
policies each sample's ``k``-th sampled segment is a turn: in concat mode turn ``k``, in a
per-turn sample the sample's own turn; earlier replies in window samples are mask-0 copies.

``reasoning_reward(episodes) -> dict[str, float]`` (optional, ``vagent.rewards``) runs after the
rollout on the episodes without error; it adds to ``turn.reward`` and fills
``reasoning_rewards``/``reasoning_scores``; its metrics are merged into ``result.metrics``.

The result is a list of episodes (:class:`RolloutResult`, a ``list`` subclass) whose ``metrics``
attribute holds :func:`rollout_metrics` plus ``perf/`` timings and the reasoning-reward metrics.

Asynchronous schedule (``schedule="async"``, :mod:`vagent.rollout.async_loop`): the steps above
without the per-turn barrier; each trajectory runs in its own thread and asks the (thread-safe,
batching) policy for one reply at a time, with the same turn seeds. Same episodes as lockstep
(greedy, or sampled with per-request seeds; tested). Each conversation carries ``key =
traj_id`` (replica routing, per-request seeds) and each ``Turn`` the ``weights_version`` of the
engine that sampled it.
"""

from __future__ import annotations

import dataclasses
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Mapping, Sequence

from vagent.rollout.async_loop import rollout_async
from vagent.rollout.policy import Message, Policy, SamplingConfig
from vagent.rollout.records import Episode
from vagent.rollout.trajectory import (
    MODES, SCHEDULES, EnvSpec, RolloutResult, _check_args, _close, _encode_final_observations, _engine_metrics,
    _Live, _next_conversation, _record, _start, _step, _turn_seed, rollout_metrics,
)

__all__ = ["EnvSpec", "RolloutResult", "rollout", "rollout_metrics", "MODES", "SCHEDULES"]


def rollout(
    env_specs: Sequence[EnvSpec],
    policy: Policy,
    sampling: SamplingConfig,
    *,
    group_size: int = 1,
    max_turns: int,
    mode: str = "concat",
    window: int | None = None,
    reasoning_reward: Callable[[list[Episode]], Mapping[str, float]] | None = None,
    max_workers: int = 16,
    env_factory: Callable[[EnvSpec], Any] | None = None,
    schedule: str = "lockstep",
    on_turn: Callable[[int, int], None] | None = None,
) -> RolloutResult:
    """Roll out ``len(env_specs) * group_size`` episodes (see the module docstring).

    Args:
        env_specs: the envs; each is run ``group_size`` times (one group per spec).
        policy: anything with ``act(conversations, sampling) -> list[Reply]``; a policy with
            ``needs_envs = True`` (``SolverPolicy``) is called as ``act(convs, sampling, envs=...)``.
        sampling: sampling parameters (``max_new_tokens`` is the per-turn token budget).
        group_size: rollouts per spec (GRPO's n).
        max_turns: the turn limit (reaching it truncates the episode).
        mode: ``"concat"`` or ``"no_concat"``; window: turns of history per sample (concat only).
        reasoning_reward: optional ``(episodes) -> metrics`` applied after the rollout.
        max_workers: threads stepping envs concurrently.
        env_factory: optional ``(spec) -> Env`` used for specs without their own ``factory``.
        schedule: ``"lockstep"`` (one batched policy call per turn) or ``"async"`` (each
            trajectory advances on its own; see *Asynchronous schedule*).
        on_turn: optional ``(turns_done, episodes_running)`` called after each lockstep turn
            (progress displays); the asynchronous schedule has no turn boundary and does not call it.
    Returns:
        :class:`RolloutResult`: the episodes in (spec, group member) order, with ``.metrics``.
    """
    if schedule == "async":
        return rollout_async(env_specs, policy, sampling, group_size=group_size, max_turns=max_turns, mode=mode,
                              window=window, reasoning_reward=reasoning_reward, env_factory=env_factory)
    if schedule != "lockstep":
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    window = _check_args(env_specs, group_size, max_turns, mode, window, policy)
    t_start = time.perf_counter()
    engine_stats = getattr(getattr(policy, "engine", None), "stats", None)  # HFEngine's prefix-reuse counters
    stats_before = dict(engine_stats) if isinstance(engine_stats, dict) else None
    lives, specs = [], []
    for gi, spec in enumerate(env_specs):
        for g in range(group_size):
            ep = Episode(env_name=spec.name, env_config=dict(spec.config), seed=int(spec.seed), group_id=gi,
                         traj_id=gi * group_size + g, system_prompt="")
            lives.append(_Live(ep))
            specs.append(spec)
    gen_time = env_time = 0.0
    needs_envs = bool(getattr(policy, "needs_envs", False))
    with ThreadPoolExecutor(max_workers=max(1, min(max_workers, len(lives) or 1))) as pool:
        try:
            t0 = time.perf_counter()
            list(pool.map(lambda ls: _start(ls[0], ls[1], env_factory), zip(lives, specs)))
            env_time += time.perf_counter() - t0
            for t in range(max_turns):
                active = [lv for lv in lives if not lv.done]
                if not active:
                    break
                for lv in active:
                    _next_conversation(lv, window)
                convs = [lv.conv for lv in active]
                sampling_t = dataclasses.replace(sampling, seed=_turn_seed(sampling.seed, t))
                t0 = time.perf_counter()
                if needs_envs:
                    replies = policy.act(convs, sampling_t, envs=[lv.env for lv in active])
                else:
                    replies = policy.act(convs, sampling_t)
                gen_time += time.perf_counter() - t0
                if len(replies) != len(convs):
                    raise RuntimeError(f"policy.act returned {len(replies)} replies for {len(convs)} conversations")
                stepping = []
                for lv, reply in zip(active, replies):
                    if reply.error is not None or reply.finish_reason == "error":
                        lv.episode.error = f"policy: {reply.error or 'finish_reason=error'}"
                        lv.done = True
                    elif reply.finish_reason == "context_limit":
                        if len(lv.conv.segments) != lv.n_segments_before:
                            raise RuntimeError("a policy that hit its context limit must not append segments")
                        lv.conv.messages.pop()  # the unanswered observation becomes final_observation
                        if window is not None:
                            lv.episode.samples.pop()
                        lv.episode.truncated, lv.episode.final_observation, lv.done = True, lv.obs, True
                    else:
                        lv.conv.messages.append(Message("assistant", reply.text))
                        stepping.append((lv, reply))
                t0 = time.perf_counter()
                results = list(pool.map(lambda lr: _step(lr[0], lr[1].text), stepping))
                env_time += time.perf_counter() - t0
                for (lv, reply), stepped in zip(stepping, results):
                    if stepped is not None:
                        _record(lv, t, reply, stepped, max_turns, window)
                if on_turn is not None:
                    on_turn(t + 1, sum(not lv.done for lv in lives))
        finally:
            list(pool.map(_close, lives))
    episodes = [lv.episode for lv in lives]
    _encode_final_observations(episodes, policy)
    metrics = rollout_metrics(episodes)
    if reasoning_reward is not None:
        metrics.update({k: float(v) for k, v in (reasoning_reward([e for e in episodes if e.error is None]) or {}).items()})
    wall = time.perf_counter() - t_start
    n_tokens = sum(len(t.sampled_token_ids) for e in episodes for t in e.turns)
    metrics.update({
        "perf/rollout_time_s": wall,
        "perf/generate_time_s": gen_time,
        "perf/env_time_s": env_time,
        "perf/rollout_tokens_per_s": n_tokens / gen_time if gen_time > 0 else 0.0,
    })
    metrics.update(_engine_metrics(engine_stats, stats_before))
    return RolloutResult(episodes, metrics)


