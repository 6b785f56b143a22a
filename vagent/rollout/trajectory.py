"""One trajectory's life in a rollout, shared by the lockstep (:mod:`vagent.rollout.loop`) and the
asynchronous (:mod:`vagent.rollout.async_loop`) schedules. The two differ only in how they batch
the calls below; each trajectory runs::

    live = new_lives(specs, group_size)[i]; start_env(live, env_factory)
    for t in range(max_turns):                       (until live.finished)
        next_conversation(live, window)              this turn's sample
        reply = act(policy, [live, ...], sampling, t)[i]
        if apply_reply(live, reply, window):         an error or context limit ends the episode here
            stepped = step_env(live, reply.text)     (None: the env failed; the episode is marked)
            record_turn(live, t, reply, stepped, max_turns, window)
    close_env(live)

The semantics (turn seeds, context modes, errors as errors) are documented in
:mod:`vagent.rollout.loop`; the end of a rollout (metrics, timings) is :mod:`vagent.rollout.finish`.
"""

from __future__ import annotations

import dataclasses
import logging
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, NamedTuple, Protocol, Sequence, TypeGuard, TypeVar

from vagent.envs.base import Env, Observation, StepResult
from vagent.envs.formats import ParsedResponse, parse_response
from vagent.rollout.encoding import context_copy
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
    factory: Callable[[], Env] | None = None


#: ``(spec) -> Env``: makes the env of a spec without its own ``factory`` (``rollout(env_factory=)``)
EnvFactory = Callable[[EnvSpec], Env]


class EnvAwarePolicy(Protocol):
    """A policy that reads the live envs (``SolverPolicy``): it declares ``needs_envs = True`` and
    :func:`act` calls it as ``act(conversations, sampling, envs=[one env per conversation])``."""

    def act(self, conversations: Sequence[Conversation], sampling: SamplingConfig,
            envs: Sequence[Env] | None = None) -> list[Reply]: ...


def _needs_envs(policy: Policy) -> TypeGuard[EnvAwarePolicy]:
    """Whether ``policy`` declares ``needs_envs = True`` (an :class:`EnvAwarePolicy`)."""
    return bool(getattr(policy, "needs_envs", False))


@dataclass
class _Block:
    """One completed turn as context: its messages and (token policies) its segments."""

    user: Message
    assistant: Message
    user_segments: list[Segment]
    reply_segments: list[Segment]


@dataclass
class Live:
    """An episode being rolled out."""

    episode: Episode
    spec: EnvSpec
    env: Env | None = None
    obs: Observation | None = None
    #: the episode has ended (terminated, truncated, or an error): no more turns
    finished: bool = False
    system: Message | None = None
    system_segments: list[Segment] = field(default_factory=list)
    blocks: list[_Block] = field(default_factory=list)
    conv: Conversation | None = None  # the current sample's conversation
    n_pending: int = 0  # messages of conv the policy has to encode this turn
    n_segments_before: int = 0


_T = TypeVar("_T")


def _required(value: _T | None, what: str) -> _T:
    """``value``, which this stage of the episode needs set (see the module docstring for the order)."""
    if value is None:
        raise RuntimeError(f"{what} is not set at this point of the episode: the calls must follow the order "
                           "start_env, next_conversation, act, apply_reply, step_env, record_turn")
    return value


class Stepped(NamedTuple):
    """What one env step returned, with the env's state around it."""

    result: StepResult
    state_before: dict
    state_after: dict


def new_lives(env_specs: Sequence[EnvSpec], group_size: int) -> list[Live]:
    """One live episode per (spec, group member), in that order: ``group_id`` = the spec's index,
    ``traj_id`` = ``spec_index * group_size + member``."""
    lives = []
    for gi, spec in enumerate(env_specs):
        for g in range(group_size):
            ep = Episode(env_name=spec.name, env_config=dict(spec.config), seed=int(spec.seed), group_id=gi,
                         traj_id=gi * group_size + g, system_prompt="")
            lives.append(Live(ep, spec))
    return lives


def turn_seed(seed: int, turn: int) -> int:
    """The sampling seed of turn ``turn``: it depends on the base seed and the turn only."""
    return (int(seed) * 1_000_003 + int(turn)) % (2**63)


def _make_env(spec: EnvSpec, env_factory: EnvFactory | None) -> Env:
    if spec.factory is not None:
        return spec.factory()
    if env_factory is not None:
        return env_factory(spec)
    from vagent.envs import make

    return make(spec.name, **dict(spec.config))


#: (where, env, error) already warned in this process: an env that fails the same way for every
#: episode (a missing package, a dead server) is said once, not once per episode; each episode's
#: record keeps its own error, and the step or the eval's last line counts them
_WARNED: set[tuple[str, str, str]] = set()
_WARNED_MAX = 1000


def _warn_env_failure(where: str, env: str, seed: int, exc: BaseException) -> None:
    """``env X seed S failed at <where>: <error>``, the first time this error is seen for this env
    in this process; again at debug level only."""
    key = (where, env, str(exc))
    if key in _WARNED:
        logger.debug("env %s seed %s failed at %s: %s", env, seed, where, exc)
        return
    if len(_WARNED) < _WARNED_MAX:
        _WARNED.add(key)
    logger.warning("env %s seed %s failed at %s: %s (said once: other episodes failing the same way are counted, "
                   "not repeated)", env, seed, where, exc)


def _env_error(exc: BaseException) -> str:
    return "env: " + "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).strip()


def start_env(live: Live, env_factory: EnvFactory | None) -> None:
    """Make and reset the env of ``live.spec`` (in a worker thread); errors mark the episode."""
    spec = live.spec
    try:
        env = live.env = _make_env(spec, env_factory)
        obs, _info = env.reset(spec.seed)
        if not isinstance(obs, Observation):
            raise TypeError(f"env.reset must return (Observation, dict), got {type(obs).__name__}")
        live.obs = obs
        live.episode.system_prompt = env.system_prompt()
        live.system = Message("system", live.episode.system_prompt)
    except Exception as exc:  # noqa: BLE001 -- recorded as an episode error, never a reward
        live.episode.error = _env_error(exc)
        live.finished = True
        _warn_env_failure("reset", spec.name, spec.seed, exc)


def step_env(live: Live, text: str) -> Stepped | None:
    """Step the env with the reply's text; None when it failed (the episode is marked)."""
    try:
        env = _required(live.env, "the env (start_env)")
        before = env.state()
        result = env.step(text)
        if not isinstance(result, StepResult):
            raise TypeError(f"env.step must return a StepResult, got {type(result).__name__}")
        after = env.state()
        return Stepped(result, before, after)
    except Exception as exc:  # noqa: BLE001 -- recorded as an episode error, never a reward
        live.episode.error = _env_error(exc)
        live.finished = True
        _warn_env_failure("step", live.episode.env_name, live.episode.seed, exc)
        return None


def close_env(live: Live) -> None:
    """Close the env; a failure is logged (closing must not lose the rollout)."""
    if live.env is None:
        return
    try:
        live.env.close()
    except Exception as exc:  # noqa: BLE001 -- closing must not lose the rollout; logged
        logger.warning("env %s close failed: %s", live.episode.env_name, exc)


def _parsed(info: Mapping[str, Any], env: Env, reply: str, episode: Episode) -> ParsedResponse:
    """The env's parse of the reply (authoritative), else a parse with the env's config.

    The config is ``env.config``; for an env without one (a remote client) the registered env's
    declared config built from the episode's ``env_config``; ``action_sep`` comes from the env
    (or its registered class), default ``","``.
    """
    given = info.get("parsed")
    if isinstance(given, ParsedResponse):
        return given
    if isinstance(given, Mapping):
        fields = dict(given)
        fields["actions"] = tuple(fields.get("actions", ()))
        return ParsedResponse(**fields)
    cfg: Any = getattr(env, "config", None)  # an env's own declared config (each env has its own class)
    sep_owner: object = env
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


def next_conversation(live: Live, window: int | None) -> None:
    """Set ``live.conv`` to the conversation of this turn's sample (see the module docstring)."""
    obs = _required(live.obs, "the observation (start_env)")
    system = _required(live.system, "the system message (start_env)")
    user = Message("user", obs.text, obs.images)
    if window is None:  # concat: one growing conversation
        if live.conv is None:
            live.conv = Conversation(messages=[system], key=live.episode.traj_id)
            live.episode.samples.append(live.conv)
        conv = live.conv
        conv.messages.append(user)
    else:
        blocks = live.blocks[len(live.blocks) - window:] if window > 0 else []
        messages, segments = [system], list(live.system_segments)
        for b in blocks:
            messages += [b.user, b.assistant]
            segments += b.user_segments + [context_copy(s) for s in b.reply_segments]
        messages.append(user)
        conv = live.conv = Conversation(messages, segments, n_encoded=len(messages) - 1 if segments else 0,
                                        key=live.episode.traj_id)
        live.episode.samples.append(conv)
    live.n_pending = len(conv.messages) - conv.n_encoded
    live.n_segments_before = len(conv.segments)


def _split_new_segments(live: Live) -> tuple[list[Segment], list[Segment]]:
    """(pending-message segments, reply segments) the policy added this turn; [] for text policies."""
    new = _required(live.conv, "the conversation (next_conversation)").segments[live.n_segments_before:]
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


def act(policy: Policy, lives: Sequence[Live], sampling: SamplingConfig, turn: int) -> list[Reply]:
    """ONE policy call for the current conversations of ``lives``, seeded with ``turn_seed``; a
    policy with ``needs_envs`` (``SolverPolicy``) also gets the envs. One reply per conversation."""
    sampling_t = dataclasses.replace(sampling, seed=turn_seed(sampling.seed, turn))
    convs = [_required(lv.conv, "the conversation (next_conversation)") for lv in lives]
    if _needs_envs(policy):
        replies = policy.act(convs, sampling_t, envs=[_required(lv.env, "the env (start_env)") for lv in lives])
    else:
        replies = policy.act(convs, sampling_t)
    if len(replies) != len(convs):
        noun = "conversations" if len(convs) != 1 else "conversation"
        raise RuntimeError(f"policy.act returned {len(replies)} replies for {len(convs)} {noun}")
    return replies


def apply_reply(live: Live, reply: Reply, window: int | None) -> bool:
    """Take the policy's reply into the episode; True when the env should be stepped with it.

    ``Reply.error`` (or ``finish_reason == "error"``) ends the episode with ``error = "policy: ..."``;
    ``finish_reason == "context_limit"`` ends it as truncated before this turn, with the unanswered
    observation as ``final_observation``; otherwise the reply joins the conversation.
    """
    if reply.error is not None or reply.finish_reason == "error":
        live.episode.error = f"policy: {reply.error or 'finish_reason=error'}"
        live.finished = True
        return False
    conv = _required(live.conv, "the conversation (next_conversation)")
    if reply.finish_reason == "context_limit":
        if len(conv.segments) != live.n_segments_before:
            raise RuntimeError("a policy that hit its context limit must not append segments")
        conv.messages.pop()  # the unanswered observation becomes final_observation
        if window is not None:
            live.episode.samples.pop()
        live.episode.truncated, live.episode.final_observation, live.finished = True, live.obs, True
        return False
    conv.messages.append(Message("assistant", reply.text))
    return True


def record_turn(live: Live, t: int, reply: Reply, stepped: Stepped, max_turns: int, window: int | None) -> None:
    """Record turn ``t`` (the reply and its env step) and end the episode where it ends."""
    result, before, after = stepped
    conv = _required(live.conv, "the conversation (next_conversation)")
    obs = _required(live.obs, "the observation (start_env)")
    user_segs, reply_segs = _split_new_segments(live)
    if t == 0 and user_segs and conv.messages[0].role == "system":
        live.system_segments = user_segs[:1]
    info = dict(result.info)
    parsed = _parsed(info, _required(live.env, "the env (start_env)"), reply.text, live.episode)
    info.pop("parsed", None)
    if window is None:
        prompt_ids = [i for s in user_segs for i in s.input_ids]
    else:  # a per-turn sample: its whole context is this turn's prompt
        prompt_ids = [i for s in conv.segments[: len(conv.segments) - len(reply_segs)] for i in s.input_ids]
    live.episode.turns.append(Turn(
        index=t, observation=obs, reply=reply.text, parsed=parsed, env_reward=float(result.reward),
        reward=float(result.reward), terminated=bool(result.terminated), truncated=bool(result.truncated),
        info=info, state_before=before, state_after=after, prompt_token_ids=prompt_ids,
        sampled_token_ids=list(reply.token_ids or []), sampled_logprobs=list(reply.logprobs or []),
        n_images=len(obs.images), finish_reason=reply.finish_reason, usage=dict(reply.usage),
        weights_version=getattr(reply, "weights_version", None),
        token_versions=getattr(reply, "token_versions", None),
    ))
    assistant = conv.messages[-1]
    live.blocks.append(_Block(conv.messages[-2], assistant, user_segs[-1:], reply_segs))
    live.obs = result.obs
    if result.terminated or result.truncated:
        live.episode.terminated = bool(result.terminated)
        live.episode.truncated = bool(result.truncated) and not result.terminated
        live.finished = True
    elif t == max_turns - 1:
        live.episode.truncated = True
        live.finished = True
    if live.episode.truncated:
        live.episode.final_observation = result.obs


def check_args(env_specs: Sequence[EnvSpec], group_size: int, max_turns: int, mode: str, window: int | None,
               policy: Policy) -> int | None:
    """Refuse arguments ``rollout`` cannot run; the window of the mode (0 for no_concat)."""
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
