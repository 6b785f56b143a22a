"""The reasoning reward: judge each turn's state descriptions and add the scores to its reward.

VAGEN's WorldModeling reward (docs/algorithms.md reference section 7). For every turn whose format was correct
(``turn.parsed.format_ok``; a malformed turn is never judged and keeps its reward):

- grounding:     ``<observation>`` judged against ``turn.state_before``;
- world modeling: ``<prediction>`` judged against ``turn.state_after``;

(a field the format does not have, or an empty one, is not judged). For each judged field::

    s      = judge score in [0, 1]                      -> turn.reasoning_scores[kind]
                                                           (its reason, and the guards' -> turn.judge_reasons[kind])
    s'     = 0 if the rule checks fail, else s           (anti_hacking.rule_checks)
    r      = penalty if the description is one of the top-k frequent recent ones and s' < threshold
             else weight_kind * s'                       -> turn.reasoning_rewards[kind]
    turn.reward += r

Calling it again on the same episodes replaces (does not add twice) the reasoning reward.
All judgments of one call (the whole rollout batch) go to the judge in ONE ``score`` call, so an
LLM judge runs them concurrently. The frequency tracker persists across calls (its window spans
training steps), one per kind.

Metrics (documented in docs/metrics/rewards.md): ``reward/grounding``, ``reward/worldmodeling``
(mean raw score over judged fields; absent when none was judged), ``reward/grounding_reward``,
``reward/worldmodeling_reward`` (mean reward added), ``reward/judged_turns``,
``reward/judge_fallbacks``, ``reward/judge_fallback_rate``, ``reward/hacking_penalties``,
``reward/missing_entities``, ``reward/too_long``, ``reward/judge_<counter>`` for the judge's own
counters (LLM: requests, retries, cache_hits, ...), and ``perf/judge_time_s``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from vagent.config import ConfigError, from_mapping
from vagent.rewards.anti_hacking import AntiHackingConfig, FrequencyTracker, rule_checks
from vagent.rewards.base import KINDS, EnvJudgeInfo, Judge, JudgeItem, JudgeResult, env_judge_info
from vagent.rewards.embedding import EmbeddingJudgeConfig
from vagent.rewards.llm import LLMJudgeConfig
from vagent.rewards.rule import RuleJudgeConfig

JUDGES = ("rule", "llm", "embedding")


@dataclass
class ReasoningRewardConfig:
    """The reasoning reward (``reasoning_reward:`` in a run config)."""

    #: which judge scores descriptions: rule (default, no network), llm (an OpenAI-compatible endpoint) or embedding
    judge: str = "rule"
    #: weight of the grounding score (<observation> vs the state before the step)
    grounding_weight: float = 0.5
    #: weight of the world-modeling score (<prediction> vs the state after the step)
    worldmodeling_weight: float = 0.5
    #: rule-judge options (also used by the llm judge's parse mode and its rule fallback)
    rule: RuleJudgeConfig = field(default_factory=RuleJudgeConfig)
    #: llm-judge options (endpoint, mode, retries, deadline, fallback)
    llm: LLMJudgeConfig = field(default_factory=LLMJudgeConfig)
    #: embedding-judge options
    embedding: EmbeddingJudgeConfig = field(default_factory=EmbeddingJudgeConfig)
    #: anti-hacking guards (frequent-description penalty, rule checks)
    anti_hacking: AntiHackingConfig = field(default_factory=AntiHackingConfig)

    def __post_init__(self) -> None:
        for name, cls in (("rule", RuleJudgeConfig), ("llm", LLMJudgeConfig), ("embedding", EmbeddingJudgeConfig),
                          ("anti_hacking", AntiHackingConfig)):
            value = getattr(self, name)
            if isinstance(value, Mapping):  # ReasoningRewardConfig(llm={"base_url": ...}) works too
                setattr(self, name, from_mapping(cls, value, where=f"reasoning_reward.{name}"))
            elif not isinstance(value, cls):
                raise ConfigError(f"reasoning_reward.{name}: expected a mapping of {cls.__name__} fields, got {value!r}.")
        if self.judge not in JUDGES:
            raise ConfigError(f"reasoning_reward.judge: expected one of {JUDGES}, got {self.judge!r}.")
        if self.grounding_weight < 0 or self.worldmodeling_weight < 0:
            raise ConfigError("reasoning_reward: grounding_weight and worldmodeling_weight must be >= 0 "
                              f"(got {self.grounding_weight}, {self.worldmodeling_weight}); 0 turns a field off.")


def make_judge(name: str, config: ReasoningRewardConfig | None = None) -> Judge:
    """Build judge ``name`` ("rule", "llm", "embedding") from the options in ``config``."""
    cfg = config or ReasoningRewardConfig()
    if name == "rule":
        from vagent.rewards.rule import RuleJudge

        return RuleJudge(cfg.rule)
    if name == "llm":
        from vagent.rewards.llm import LLMJudge

        return LLMJudge(cfg.llm, cfg.rule)
    if name == "embedding":
        from vagent.rewards.embedding import EmbeddingJudge

        return EmbeddingJudge(cfg.embedding)
    raise ConfigError(f"unknown judge {name!r}; expected one of {JUDGES}.")


@dataclass
class _Job:
    turn: Any
    kind: str
    item: JudgeItem


class ReasoningReward:
    """``(episodes) -> metrics``: judges descriptions and adds the weighted scores to turn rewards.

    Pass it as ``rollout(..., reasoning_reward=ReasoningReward(config))``. ``judge`` overrides the
    judge the config names (any object with ``score(items)``).
    """

    def __init__(self, config: ReasoningRewardConfig | Mapping[str, Any] | None = None, judge: Judge | None = None) -> None:
        if config is None:
            config = ReasoningRewardConfig()
        elif isinstance(config, Mapping):
            config = from_mapping(ReasoningRewardConfig, config, where="reasoning_reward")
        self.config: ReasoningRewardConfig = config
        self.judge: Judge = judge if judge is not None else make_judge(config.judge, config)
        ah = config.anti_hacking
        self.trackers = {k: FrequencyTracker(ah.window, ah.top_k, ah.threshold, ah.min_count) for k in KINDS}

    def weight(self, kind: str) -> float:
        return self.config.grounding_weight if kind == "grounding" else self.config.worldmodeling_weight

    def _jobs(self, episodes: Sequence[Any]) -> list[_Job]:
        jobs: list[_Job] = []
        infos: dict[str, EnvJudgeInfo] = {}
        for ep in episodes:
            if getattr(ep, "error", None) is not None:
                continue
            for turn in ep.turns:
                if not turn.parsed.format_ok:
                    continue
                for kind, text, state in (("grounding", turn.parsed.observation, turn.state_before),
                                          ("worldmodeling", turn.parsed.prediction, turn.state_after)):
                    if not text or self.weight(kind) == 0.0:
                        continue
                    if ep.env_name not in infos:
                        infos[ep.env_name] = env_judge_info(ep.env_name)
                    info = infos[ep.env_name]
                    reference = None
                    if self.config.judge == "embedding" and info.describe_state is not None:
                        reference = info.describe_state(state, "natural")
                    jobs.append(_Job(turn, kind, JudgeItem(text, state, info.spec, kind, info.legend, reference,
                                                           ep.env_name)))
        return jobs

    def _reason(self, job: _Job, res: JudgeResult, score: float, reward: float, check_failed: str,
                penalized: bool) -> str:
        """The turn's judge reason for one field: the judge's own, then what the guards made of it."""
        ah = self.config.anti_hacking
        why = res.reason or f"{type(self.judge).__name__} score {res.score:.3f}"
        if check_failed:
            why += f"; rule check failed ({check_failed}): score set to 0"
        if penalized:
            seen = self.trackers[job.kind].count(job.item.description)
            why += (f"; anti-hacking penalty {reward:+.3f}: a frequent description (seen {seen} times in the last "
                    f"{ah.window}) scoring {score:.2f} < {ah.threshold:g}")
        else:
            why += f"; reward {self.weight(job.kind):g} x {score:.3f} = {reward:+.3f}"
        return why

    def __call__(self, episodes: Sequence[Any]) -> dict[str, float]:
        t0 = time.perf_counter()
        jobs = self._jobs(episodes)
        results = self.judge.score([j.item for j in jobs]) if jobs else []
        if len(results) != len(jobs):
            raise RuntimeError(f"judge {type(self.judge).__name__} returned {len(results)} results for {len(jobs)} items")
        ah = self.config.anti_hacking
        scores: dict[str, list[float]] = {k: [] for k in KINDS}
        rewards: dict[str, list[float]] = {k: [] for k in KINDS}
        counts = {"fallbacks": 0, "hacking_penalties": 0, "missing_entities": 0, "too_long": 0}
        judged_turns = set()
        for job, res in zip(jobs, results):
            score = res.score
            check_failed = ""
            if ah.rule_checks:
                check = rule_checks(job.item, ah)
                counts["missing_entities"] += bool(check.missing)
                counts["too_long"] += check.too_long
                if not check.ok:
                    score = 0.0
                    check_failed = check.reason
            penalized = ah.frequency_penalty and self.trackers[job.kind].observe(job.item.description, score)
            reward = ah.penalty if penalized else self.weight(job.kind) * score
            counts["hacking_penalties"] += penalized
            counts["fallbacks"] += res.fallback
            turn = job.turn
            turn.reward += reward - turn.reasoning_rewards.get(job.kind, 0.0)
            turn.reasoning_rewards[job.kind] = reward
            turn.reasoning_scores[job.kind] = res.score
            turn.judge_reasons[job.kind] = self._reason(job, res, score, reward, check_failed, penalized)
            scores[job.kind].append(res.score)
            rewards[job.kind].append(reward)
            judged_turns.add(id(turn))
        metrics: dict[str, float] = {}
        for kind in KINDS:
            if scores[kind]:
                metrics[f"reward/{kind}"] = sum(scores[kind]) / len(scores[kind])
                metrics[f"reward/{kind}_reward"] = sum(rewards[kind]) / len(rewards[kind])
        metrics["reward/judged_turns"] = float(len(judged_turns))
        metrics["reward/judge_fallbacks"] = float(counts["fallbacks"])
        metrics["reward/judge_fallback_rate"] = counts["fallbacks"] / len(jobs) if jobs else 0.0
        for name in ("hacking_penalties", "missing_entities", "too_long"):
            metrics[f"reward/{name}"] = float(counts[name])
        for name, value in (getattr(self.judge, "last_stats", None) or {}).items() if jobs else ():
            if name not in ("items", "judgments", "fallbacks", "failed"):
                metrics[f"reward/judge_{name}"] = float(value)
        metrics["perf/judge_time_s"] = time.perf_counter() - t0
        return metrics
