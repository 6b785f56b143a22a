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
import logging
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from vagent.envs.base import Observation, StepResult
from vagent.envs.formats import ParsedResponse, parse_response
from vagent.rollout.encoding import TokenPolicy, context_copy
from vagent.rollout.policy import Conversation, Message, Policy, Reply, SamplingConfig, Segment
from vagent.rollout.records import Episode, Turn

logger = logging.getLogger(__name__)

MODES = ("concat", "no_concat")
SCHEDULES = ("lockstep", "async")


@dataclass(frozen=True)
class EnvSpec:
    """One environment instance to roll out: ``vagent.envs.make(name, **config)`` reset with ``seed``.

    ``factory`` (optional) makes the env instead, e.g. ``lambda: RemoteEnv(url, name, config)``;
    ``name``/``config`` are then only recorded on the episodes.
    """

    #: registered env name (``vagent.envs.list_envs()``)
    name: str
    #: env config (keys of the env's declared Config)
    config: Mapping[str, Any] = field(default_factory=dict)
    #: reset seed; the same seed and config give the same initial state in any process
    seed: int = 0
    #: zero-argument callable returning an Env (remote envs); None = vagent.envs.make
    factory: Callable[[], Any] | None = None


class RolloutResult(list):
    """The episodes (a ``list[Episode]``) plus ``metrics: dict[str, float]``."""

    def __init__(self, episodes: Sequence[Episode] = (), metrics: dict[str, float] | None = None):
        super().__init__(episodes)
        self.metrics: dict[str, float] = dict(metrics or {})


@dataclass
class _Block:
    """One completed turn as context: its messages and (token policies) its segments."""

    user: Message
    assistant: Message
    user_segments: list[Segment]
    reply_segments: list[Segment]


@dataclass
class _Live:
    """An episode being rolled out."""

    episode: Episode
    env: Any = None
    obs: Observation | None = None
    done: bool = False
    system: Message | None = None
    system_segments: list[Segment] = field(default_factory=list)
    blocks: list[_Block] = field(default_factory=list)
    conv: Conversation | None = None  # the current sample's conversation
    n_pending: int = 0  # messages of conv the policy has to encode this turn
    n_segments_before: int = 0


def _turn_seed(seed: int, turn: int) -> int:
    return (int(seed) * 1_000_003 + int(turn)) % (2**63)


def _make_env(spec: EnvSpec, env_factory: Callable[[EnvSpec], Any] | None) -> Any:
    if spec.factory is not None:
        return spec.factory()
    if env_factory is not None:
        return env_factory(spec)
    from vagent.envs import make

    return make(spec.name, **dict(spec.config))


def _env_error(exc: BaseException) -> str:
    return "env: " + "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).strip()


def _start(live: _Live, spec: EnvSpec, env_factory) -> None:
    """Make and reset the env (in a worker thread); errors mark the episode."""
    try:
        live.env = _make_env(spec, env_factory)
        obs, _info = live.env.reset(spec.seed)
        if not isinstance(obs, Observation):
            raise TypeError(f"env.reset must return (Observation, dict), got {type(obs).__name__}")
        live.obs = obs
        live.episode.system_prompt = live.env.system_prompt()
        live.system = Message("system", live.episode.system_prompt)
    except Exception as exc:  # noqa: BLE001 -- recorded as an episode error, never a reward
        live.episode.error = _env_error(exc)
        live.done = True
        logger.warning("env %s seed %s failed at reset: %s", spec.name, spec.seed, exc)


def _step(live: _Live, text: str) -> tuple[StepResult, dict, dict] | None:
    try:
        before = live.env.state()
        result = live.env.step(text)
        if not isinstance(result, StepResult):
            raise TypeError(f"env.step must return a StepResult, got {type(result).__name__}")
        after = live.env.state()
        return result, before, after
    except Exception as exc:  # noqa: BLE001 -- recorded as an episode error, never a reward
        live.episode.error = _env_error(exc)
        live.done = True
        logger.warning("env %s seed %s failed at step: %s", live.episode.env_name, live.episode.seed, exc)
        return None


def _close(live: _Live) -> None:
    if live.env is None:
        return
    try:
        live.env.close()
    except Exception as exc:  # noqa: BLE001 -- closing must not lose the rollout; logged
        logger.warning("env %s close failed: %s", live.episode.env_name, exc)


def _parsed(info: Mapping[str, Any], env: Any, reply: str, episode: Episode) -> ParsedResponse:
    """The env's parse of the reply (authoritative), else a parse with the env's config.

    The config is ``env.config``; for an env without one (a remote client) the registered env's
    declared config built from the episode's ``env_config``; ``action_sep`` comes from the env
    (or its registered class), default ``","``.
    """
    p = info.get("parsed")
    if isinstance(p, ParsedResponse):
        return p
    if isinstance(p, Mapping):
        d = dict(p)
        d["actions"] = tuple(d.get("actions", ()))
        return ParsedResponse(**d)
    cfg, sep_owner = getattr(env, "config", None), env
    if getattr(cfg, "format", None) is None:
        from vagent.envs.registry import env_class, make_config

        try:
            cfg, sep_owner = make_config(episode.env_name, **episode.env_config), env_class(episode.env_name)
        except KeyError as exc:
            raise TypeError(
                f"{type(env).__name__}: cannot tell how the reply was parsed. An env should return "
                "info['parsed'] (the ParsedResponse it used), have a config with a 'format' field, "
                f"or be registered under its EnvSpec name ({exc})."
            ) from exc
    sep = getattr(sep_owner, "action_sep", getattr(cfg, "action_sep", ","))
    return parse_response(reply, cfg.format, sep, getattr(cfg, "max_actions_per_turn", 3))


def _next_conversation(live: _Live, window: int | None) -> None:
    """Set ``live.conv`` to the conversation of this turn's sample (see the module docstring)."""
    user = Message("user", live.obs.text, live.obs.images)
    if window is None:  # concat: one growing conversation
        if live.conv is None:
            live.conv = Conversation(messages=[live.system], key=live.episode.traj_id)
            live.episode.samples.append(live.conv)
        live.conv.messages.append(user)
    else:
        blocks = live.blocks[len(live.blocks) - window:] if window > 0 else []
        messages, segments = [live.system], list(live.system_segments)
        for b in blocks:
            messages += [b.user, b.assistant]
            segments += b.user_segments + [context_copy(s) for s in b.reply_segments]
        messages.append(user)
        live.conv = Conversation(messages, segments, n_encoded=len(messages) - 1 if segments else 0,
                                 key=live.episode.traj_id)
        live.episode.samples.append(live.conv)
    live.n_pending = len(live.conv.messages) - live.conv.n_encoded
    live.n_segments_before = len(live.conv.segments)


def _split_new_segments(live: _Live) -> tuple[list[Segment], list[Segment]]:
    """(pending-message segments, reply segments) the policy added this turn; [] for text policies."""
    new = live.conv.segments[live.n_segments_before:]
    if not new:
        return [], []
    k = live.n_pending
    ok = (len(new) in (k + 1, k + 2) and not any(s.sampled for s in new[:k]) and new[k].sampled
          and not any(s.sampled for s in new[k + 1:]))
    if not ok:
        shape = ["sampled" if s.sampled else "context" for s in new]
        raise RuntimeError(
            f"a token-level policy must append one segment per new message ({k}), then one sampled "
            f"segment, then at most one end-of-turn segment; it appended {shape} "
            "(see vagent.rollout.encoding)"
        )
    return new[:k], new[k:]


def _record(live: _Live, t: int, reply: Reply, stepped, max_turns: int, window: int | None) -> None:
    result, before, after = stepped
    user_segs, reply_segs = _split_new_segments(live)
    if t == 0 and user_segs and live.conv.messages[0].role == "system":
        live.system_segments = user_segs[:1]
    info = dict(result.info)
    parsed = _parsed(info, live.env, reply.text, live.episode)
    info.pop("parsed", None)
    if window is None:
        prompt_ids = [i for s in user_segs for i in s.input_ids]
    else:  # a per-turn sample: its whole context is this turn's prompt
        prompt_ids = [i for s in live.conv.segments[: len(live.conv.segments) - len(reply_segs)] for i in s.input_ids]
    obs = live.obs
    live.episode.turns.append(Turn(
        index=t, observation=obs, reply=reply.text, parsed=parsed, env_reward=float(result.reward),
        reward=float(result.reward), terminated=bool(result.terminated), truncated=bool(result.truncated),
        info=info, state_before=before, state_after=after, prompt_token_ids=prompt_ids,
        sampled_token_ids=list(reply.token_ids or []), sampled_logprobs=list(reply.logprobs or []),
        n_images=len(obs.images), finish_reason=reply.finish_reason, usage=dict(reply.usage),
        weights_version=getattr(reply, "weights_version", None),
    ))
    assistant = live.conv.messages[-1]
    live.blocks.append(_Block(live.conv.messages[-2], assistant, user_segs[-1:], reply_segs))
    live.obs = result.obs
    if result.terminated or result.truncated:
        live.episode.terminated = bool(result.terminated)
        live.episode.truncated = bool(result.truncated) and not result.terminated
        live.done = True
    elif t == max_turns - 1:
        live.episode.truncated = True
        live.done = True
    if live.episode.truncated:
        live.episode.final_observation = result.obs


def _check_args(env_specs, group_size, max_turns, mode, window, policy) -> int | None:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if mode == "no_concat" and window not in (None, 0):
        raise ValueError("window applies to mode='concat' only (no_concat already shows only the "
                         "current observation); drop window or use mode='concat'")
    if window is not None and window < 0:
        raise ValueError(f"window must be >= 0 (turns of history), got {window}")
    if group_size < 1 or max_turns < 1:
        raise ValueError(f"group_size and max_turns must be >= 1, got {group_size} and {max_turns}")
    if not hasattr(policy, "act"):
        raise TypeError(f"policy must have act(conversations, sampling) (Policy protocol), got {type(policy).__name__}")
    for i, s in enumerate(env_specs):
        if not isinstance(s, EnvSpec):
            raise TypeError(f"env_specs[{i}] must be an EnvSpec(name, config, seed, factory=None), got {s!r}")
    return 0 if mode == "no_concat" else window


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
    Returns:
        :class:`RolloutResult`: the episodes in (spec, group member) order, with ``.metrics``.
    """
    if schedule == "async":
        from vagent.rollout.async_loop import rollout_async

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


def _engine_metrics(engine_stats: Any, stats_before: dict | None) -> dict[str, float]:
    """``perf/prompt_cache_frac`` (HFEngine prefix reuse) and ``rollout/engine_retries`` (requests
    sent again after their engine replica died) over this rollout, where the engine counts them."""
    if stats_before is None:
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


def _encode_final_observations(episodes: list[Episode], policy: Any) -> None:
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


__all__ = ["EnvSpec", "RolloutResult", "rollout", "rollout_metrics", "MODES", "SCHEDULES"]
