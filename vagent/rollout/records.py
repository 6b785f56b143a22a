"""Typed records of a rollout: one :class:`Turn` per env step, one :class:`Episode` per trajectory.

These are what every later stage reads (rewards, advantages, logging, evaluation).
:func:`error_headline` is the one line of an ``Episode.error`` that every report of it shows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vagent.envs.base import Observation
from vagent.envs.formats import ParsedResponse
from vagent.rollout.policy import Conversation, Segment


@dataclass
class Turn:
    """One turn: the observation shown, the reply sampled, what the env made of it.

    ``reward`` = ``env_reward`` + sum of ``reasoning_rewards`` (added by ``vagent.rewards``).
    ``state_before`` / ``state_after`` are ``env.state()`` before and after the step: the ground
    truth for the grounding (``<observation>``) and world-modeling (``<prediction>``) judges.
    Token-level fields are filled by local-model policies only.
    """

    index: int
    observation: Observation
    reply: str
    parsed: ParsedResponse
    env_reward: float
    reward: float
    terminated: bool
    truncated: bool
    info: dict = field(default_factory=dict)
    state_before: dict = field(default_factory=dict)
    state_after: dict = field(default_factory=dict)
    #: named reasoning rewards added to this turn, e.g. {"grounding": 0.4, "worldmodeling": 0.5}
    reasoning_rewards: dict[str, float] = field(default_factory=dict)
    #: raw judge scores in [0, 1] (before weights and penalties), for logging
    reasoning_scores: dict[str, float] = field(default_factory=dict)
    #: why each judged field scored what it did, one short line per field (the judge's reason, a
    #: failed rule check, the anti-hacking penalty; ``vagent.rewards``), for the rollout dumps
    judge_reasons: dict[str, str] = field(default_factory=dict)
    #: observation/prompt tokens (loss mask 0) appended before this turn's reply
    prompt_token_ids: list[int] = field(default_factory=list)
    #: exactly the token ids the policy sampled (loss mask 1)
    sampled_token_ids: list[int] = field(default_factory=list)
    #: sampling-time log-prob of each sampled token
    sampled_logprobs: list[float] = field(default_factory=list)
    n_images: int = 0
    finish_reason: str = "stop"
    usage: dict[str, int] = field(default_factory=dict)
    #: the weights version that sampled the reply (engines with pushed weights, e.g. RemoteEngine;
    #: None for an in-process engine, which always has the trainer's current weights); its first
    #: token's when ``token_versions`` is set
    weights_version: int | None = None
    #: per sampled token, when a push stopped the reply and it continued on the new weights
    #: (``rollout.interrupt``); None: every token is ``weights_version``
    token_versions: list[int] | None = None


@dataclass
class Episode:
    """A trajectory. ``group_id`` ties together rollouts of the same env, seed and config."""

    env_name: str
    env_config: dict[str, Any]
    seed: int
    group_id: int
    traj_id: int
    system_prompt: str
    turns: list[Turn] = field(default_factory=list)
    terminated: bool = False
    truncated: bool = False
    #: the observation after the last step (shown to the critic for truncation bootstrap)
    final_observation: Observation | None = None
    #: set when the policy backend or the env failed; the episode is excluded from training
    error: str | None = None
    #: the training samples of this episode, as the policy saw them: one Conversation holding the
    #: whole trajectory (concat mode) or one per turn (no_concat / window mode); token-level
    #: policies filled their ``segments`` (see ``vagent.rollout.batch.build_token_batch``)
    samples: list[Conversation] = field(default_factory=list)
    #: the encoded ``final_observation`` (loss mask 0) of a truncated episode, for the critic's
    #: bootstrap value; set by token-level policies only
    final_segment: Segment | None = None

    @property
    def total_reward(self) -> float:
        return float(sum(t.reward for t in self.turns))

    @property
    def env_return(self) -> float:
        return float(sum(t.env_reward for t in self.turns))

    @property
    def success(self) -> bool:
        return bool(self.turns and self.turns[-1].info.get("success", False))

    @property
    def format_accuracy(self) -> float:
        return sum(t.parsed.format_ok for t in self.turns) / len(self.turns) if self.turns else 0.0


def error_headline(error: Any) -> str:
    """The line that says what an episode's error was: its first line, or for a traceback (an env
    error is ``env: Traceback ...``) the prefix and the exception's own line, the last one."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    if not lines:
        return ""
    prefix, tb, _ = lines[0].partition("Traceback (most recent call last):")
    return prefix + lines[-1] if tb and len(lines) > 1 else lines[0]
