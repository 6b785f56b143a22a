"""The records every judge shares: what is judged (:class:`JudgeItem`), the verdict
(:class:`JudgeResult`), the :class:`Judge` protocol, and where an env's judging facts come from.

A judge scores a state description against the ground-truth state: ``score(items)`` takes the
whole batch (so remote judges can run it concurrently) and returns one result per item, in order,
each with a score in [0, 1]. ``fallback`` is True when the judge could not give its own verdict and
a fallback (the rule judge, or zero) answered instead: a named flag, counted in the metrics.

An env supplies, for judging (see :func:`env_judge_info`):

- ``judge_spec`` (class attribute, :class:`vagent.envs.base.JudgeSpec`): object types, their
  weights and synonyms, the relation words;
- ``LEGEND`` (optional, module constant) such as ``"P player, _ ice, O hole, G goal"``: what each
  grid symbol shows, for symbolic (grid) descriptions;
- ``describe_state(state, style)`` (optional, module function): a correct description, used as the
  embedding judge's reference text.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol, Sequence, runtime_checkable

from vagent.envs.base import JudgeSpec

KINDS = ("grounding", "worldmodeling")


@dataclass(frozen=True)
class JudgeItem:
    """One description to judge against one state.

    ``kind``: "grounding" (``<observation>`` vs the state before the step) or "worldmodeling"
    (``<prediction>`` vs the state after). ``legend``: the env's grid legend (symbolic
    descriptions). ``reference``: a correct description of ``state`` (embedding judge); None = the
    judge writes one from ``state["relations"]``. ``env_name``: for prompts and logs only.
    """

    description: str
    state: Mapping[str, Any]
    spec: JudgeSpec
    kind: str = "grounding"
    legend: str | None = None
    reference: str | None = None
    env_name: str = ""


@dataclass(frozen=True)
class JudgeResult:
    """A verdict: ``score`` in [0, 1]; ``fallback`` True if a fallback produced it; ``detail`` for
    logs; ``reason``: why the score is what it is, in one short human-readable line (the rule
    judge: which claimed relations matched the true ones; the LLM judge: the judge model's answer;
    a fallback: why the LLM gave no verdict). :class:`~vagent.rewards.ReasoningReward` stores it
    per turn (``Turn.judge_reasons``) and ``vagent view`` shows it."""

    score: float
    fallback: bool = False
    detail: Mapping[str, Any] = field(default_factory=dict)
    reason: str = ""

    def __post_init__(self) -> None:
        s = float(self.score)
        if not 0.0 <= s <= 1.0 or s != s:
            raise ValueError(f"JudgeResult.score must be in [0, 1], got {self.score!r}")
        object.__setattr__(self, "score", s)


@runtime_checkable
class Judge(Protocol):
    """Anything with ``score(items) -> results`` (one per item, in order).

    Judges may also expose ``last_stats: dict[str, float]`` (counters of their last ``score`` call,
    e.g. requests, retries, cache hits) which :class:`~vagent.rewards.ReasoningReward` logs.
    """

    def score(self, items: Sequence[JudgeItem]) -> list[JudgeResult]: ...


@dataclass(frozen=True)
class EnvJudgeInfo:
    """What an env provides for judging: its spec, grid legend and reference describer."""

    spec: JudgeSpec
    legend: str | None = None
    describe_state: Callable[[Mapping[str, Any], str], str] | None = None


_INFO_CACHE: dict[str, EnvJudgeInfo] = {}


def env_judge_info(env_name: str) -> EnvJudgeInfo:
    """The judging facts of registered env ``env_name`` (cached per name).

    Raises ValueError if the env declares no ``judge_spec`` (it cannot be judged: use a format
    without ``<observation>``/``<prediction>``, or turn the reasoning reward off).
    """
    if env_name in _INFO_CACHE:
        return _INFO_CACHE[env_name]
    from vagent.envs import env_class

    cls = env_class(env_name)
    spec = getattr(cls, "judge_spec", None)
    if not isinstance(spec, JudgeSpec):
        raise ValueError(
            f"env '{env_name}' ({cls.__name__}) declares no judge_spec (a vagent.envs.JudgeSpec class "
            "attribute), so its state descriptions cannot be judged. Declare one, or train it with a "
            "format without <observation>/<prediction>, or set reasoning_reward to null."
        )
    module = sys.modules.get(cls.__module__)
    legend = getattr(module, "LEGEND", None)
    describe = getattr(module, "describe_state", None)
    info = EnvJudgeInfo(spec, legend if isinstance(legend, str) else None, describe if callable(describe) else None)
    _INFO_CACHE[env_name] = info
    return info


