"""Policies without a model: scripted, random, solver, and a token-level scripted policy for tests.

- :class:`ScriptedPolicy`: replies from ``fn(conversation) -> str | Reply`` (text level).
- :class:`RandomPolicy`: uniformly random actions from a list, written in a reasoning format.
- :class:`SolverPolicy`: the env's ``optimal_actions()`` written in the env's reasoning format with
  CORRECT state descriptions (``describe_state`` of the env's module for ``<observation>``, and
  for ``<prediction>`` the state after the actions, :func:`state_after`: the env's own
  ``predict_state(reply)`` where it has one, else a deep copy of the env stepped). It
  needs the live envs: it declares ``needs_envs = True`` and ``rollout`` passes them.
- :class:`TokenScriptedPolicy`: like ScriptedPolicy but token level: it encodes the conversation
  with a real ``ChatEncoder`` and records the scripted reply's tokenizer ids as if sampled
  (logprobs 0), so mask and batch tests run without a model.

Text-level policies record no token segments; their episodes serve evaluation, SFT data and
tests, not ``build_token_batch``.
"""

from __future__ import annotations

import copy
import random
import sys
from typing import TYPE_CHECKING, Callable, Protocol, Sequence, TypeGuard

from vagent.envs.base import Env, SolvableEnv
from vagent.envs.formats import render_response
from vagent.rollout.encoding import (
    EncoderMessages, append_reply, context_tokens, encode_pending, exceeds_context,
)
from vagent.rollout.policy import Conversation, Reply, SamplingConfig

if TYPE_CHECKING:
    from vagent.models.processor import ChatEncoder


class ScriptedPolicy:
    """Replies from ``fn(conversation)``: a string, or a full :class:`Reply` (e.g. with ``error``)."""

    def __init__(self, fn: Callable[[Conversation], str | Reply]):
        self.fn = fn

    def act(self, conversations: Sequence[Conversation], sampling: SamplingConfig) -> list[Reply]:
        out = []
        for conv in conversations:
            answer = self.fn(conv)
            out.append(answer if isinstance(answer, Reply) else Reply(text=str(answer), finish_reason="stop"))
        return out


class RandomPolicy:
    """Random actions in format ``fmt``; draw ``i`` of a call uses ``Random(f"{seed}:{sampling.seed}:{i}")``.

    The rollout varies ``sampling.seed`` per turn, so a rollout is reproducible from ``seed`` and
    ``SamplingConfig.seed`` (string seeds of ``random.Random`` are hashed with SHA-512, not the
    per-process salted ``hash()``).
    """

    def __init__(self, actions: Sequence[str], fmt: str = "no_think", *, seed: int = 0,
                 max_actions: int = 1, action_sep: str = ","):
        if not actions:
            raise ValueError("RandomPolicy needs at least one action name")
        self.actions, self.fmt, self.seed = tuple(actions), fmt, seed
        self.max_actions, self.action_sep = max_actions, action_sep

    def act(self, conversations: Sequence[Conversation], sampling: SamplingConfig) -> list[Reply]:
        out = []
        for i, _ in enumerate(conversations):
            rng = random.Random(f"{self.seed}:{sampling.seed}:{i}")
            acts = [rng.choice(self.actions) for _ in range(rng.randint(1, self.max_actions))]
            text = render_response(self.fmt, {
                "think": "I pick a random move.", "observation": "I am not sure where things are.",
                "reasoning": "I pick a random move.", "prediction": "I am not sure what will happen.",
                "answer": self.action_sep.join(acts),
            })
            out.append(Reply(text=text, finish_reason="stop"))
        return out


class SolverConfig(Protocol):
    """The fields of an env's config that :func:`solver_reply` reads."""

    @property
    def format(self) -> str: ...

    @property
    def max_actions_per_turn(self) -> int: ...

    @property
    def description_style(self) -> str: ...


class SolverEnv(SolvableEnv, Protocol):
    """An env :func:`solver_reply` can answer for: a solver (``optimal_actions``), its declared
    config (reply format, actions per turn, description style) and its action names."""

    @property
    def config(self) -> SolverConfig: ...

    @property
    def action_names(self) -> Sequence[str]: ...


def _solvable(env: Env) -> TypeGuard[SolverEnv]:
    """Whether ``env`` has a solver (``optimal_actions``); its config and action names come with it."""
    return hasattr(env, "optimal_actions")


def _env_module_function(env: Env, name: str) -> Callable:
    fn = getattr(sys.modules.get(type(env).__module__), name, None)
    if fn is None:
        raise TypeError(f"{type(env).__name__}: SolverPolicy needs a module-level {name}(state, style) "
                        f"in {type(env).__module__}")
    return fn


def state_after(env: Env, reply: str) -> dict:
    """``env.state()`` after ``env.step(reply)``, ``env`` itself untouched.

    An env with a simulator that cannot be copied (primitive_skill on ManiSkill) says how with
    ``predict_state(reply) -> dict``; any other env is deep-copied and the copy stepped. TypeError,
    naming the fix, when neither works."""
    predict = getattr(env, "predict_state", None)
    if callable(predict):
        return predict(reply)
    try:
        probe = copy.deepcopy(env)
    except Exception as exc:  # noqa: BLE001 -- pickling errors of native handles have many types
        raise TypeError(
            f"{type(env).__name__} cannot be deep-copied ({type(exc).__name__}: {exc}), so the state after a reply "
            "cannot be predicted for <prediction>: give the env a predict_state(reply) -> dict method that "
            "returns state() after step(reply) and leaves the env unchanged.") from exc
    try:
        probe.step(reply)
        return probe.state()
    finally:
        probe.close()


def solver_reply(env: Env, reasoning: str = "I follow the shortest path to the goal.",
                 max_actions: int | None = None) -> str:
    """The solver's reply for ``env`` in its current state, in the env's reasoning format.

    ``<observation>`` describes ``env.state()``; ``<prediction>`` the state after the actions
    (:func:`state_after`; the env itself is untouched); ``<answer>`` holds the first
    ``max_actions`` (default: the env's ``max_actions_per_turn``) of ``env.optimal_actions()``.
    """
    if not _solvable(env):
        raise TypeError(f"{type(env).__name__} has no optimal_actions(): SolverPolicy needs a SolvableEnv")
    cfg = env.config
    describe = _env_module_function(env, "describe_state")
    n = max_actions or cfg.max_actions_per_turn
    actions = list(env.optimal_actions())[:n] or [env.action_names[0]]
    sep = getattr(env, "action_sep", ",")
    fields = {"observation": describe(env.state(), cfg.description_style), "reasoning": reasoning,
              "think": reasoning, "prediction": "(filled below)", "answer": sep.join(actions)}
    if "worldmodeling" in cfg.format:  # the formats with a <prediction> field
        fields["prediction"] = describe(state_after(env, render_response(cfg.format, fields)),
                                        cfg.description_style)
    return render_response(cfg.format, fields)


class SolverPolicy:
    """Optimal replies with correct state descriptions (see :func:`solver_reply`); local envs only."""

    needs_envs = True

    def __init__(self, reasoning: str = "I follow the shortest path to the goal.", max_actions: int | None = None):
        self.reasoning, self.max_actions = reasoning, max_actions

    def act(self, conversations: Sequence[Conversation], sampling: SamplingConfig,
            envs: Sequence[Env] | None = None) -> list[Reply]:
        if envs is None or len(envs) != len(conversations):
            raise TypeError("SolverPolicy.act needs envs=[one live env per conversation]; vagent.rollout.rollout "
                            "passes them because SolverPolicy.needs_envs is True")
        return [Reply(text=solver_reply(env, self.reasoning, self.max_actions), finish_reason="stop") for env in envs]


class TokenScriptedPolicy(EncoderMessages):
    """A token-level scripted policy: real encoder, scripted reply ids recorded as sampled.

    ``fn(conversation) -> str`` gives the reply text; its ids are
    ``encoder.tokenizer(text, add_special_tokens=False)`` followed (``end_with_eos=True``) by the
    template's end token, as a model that stops by itself would sample; logprobs are 0.
    ``max_context_tokens`` behaves as in ``HFPolicy``.
    """

    def __init__(self, encoder: ChatEncoder, fn: Callable[[Conversation], str], *, end_with_eos: bool = True,
                 max_context_tokens: int | None = None):
        self.encoder, self.fn = encoder, fn
        self.end_with_eos, self.max_context_tokens = end_with_eos, max_context_tokens

    def act(self, conversations: Sequence[Conversation], sampling: SamplingConfig) -> list[Reply]:
        out = []
        for conv in conversations:
            pending = encode_pending(conv, self.encoder)
            n_ctx = context_tokens(conv.segments, pending)
            if exceeds_context(n_ctx, sampling.max_new_tokens, self.max_context_tokens):
                out.append(Reply("", finish_reason="context_limit", usage={"prompt_tokens": n_ctx, "completion_tokens": 0}))
                continue
            text = self.fn(conv)
            ids = list(self.encoder.tokenizer(text, add_special_tokens=False)["input_ids"])
            if self.end_with_eos:
                ids.append(self.encoder.assistant_end_ids()[0])
            append_reply(conv, pending, ids, [0.0] * len(ids), self.encoder)
            out.append(Reply(text=text, token_ids=ids, logprobs=[0.0] * len(ids),
                             finish_reason="eos" if self.end_with_eos else "stop",
                             usage={"prompt_tokens": n_ctx, "completion_tokens": len(ids)}))
        return out


__all__ = ["ScriptedPolicy", "RandomPolicy", "SolverPolicy", "TokenScriptedPolicy", "solver_reply", "state_after"]
