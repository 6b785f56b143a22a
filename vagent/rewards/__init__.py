"""Reasoning rewards: judges that score the agent's state descriptions (``<observation>``) and
predictions (``<prediction>``) against the env's true state (docs/algorithms.md reference section 7).

- :class:`ReasoningReward` (``reasoning.py``): ``(episodes) -> metrics``, adds ``weight x score``
  to each correctly formatted turn's reward; pass it to ``rollout(..., reasoning_reward=...)``.
- Judges (anything with ``score(items) -> results``): :class:`RuleJudge` (``rule.py``, parser in
  ``parse.py``; the default), :class:`LLMJudge` (``llm.py``, any OpenAI-compatible endpoint),
  :class:`EmbeddingJudge` (``embedding.py``, optional extra).
- Anti-hacking guards (``anti_hacking.py``); judge agreement audit (``audit.py``,
  ``vagent judge-audit``); a scripted OpenAI-compatible server for tests (``scripted_server.py``).

See docs/rewards.md.
"""

from vagent.rewards.anti_hacking import AntiHackingConfig, CheckResult, FrequencyTracker, rule_checks
from vagent.rewards.base import KINDS, EnvJudgeInfo, Judge, JudgeItem, JudgeResult, env_judge_info
from vagent.rewards.embedding import EmbeddingJudge, EmbeddingJudgeConfig, reference_text
from vagent.rewards.llm import LLMJudge, LLMJudgeConfig, LLMJudgeError
from vagent.rewards.parse import Claim, ParsedDescription, parse_description, truth_claims
from vagent.rewards.reasoning import JUDGES, ReasoningReward, ReasoningRewardConfig, make_judge
from vagent.rewards.rule import RuleJudge, RuleJudgeConfig, rule_score, score_claims

__all__ = [
    "AntiHackingConfig", "CheckResult", "FrequencyTracker", "rule_checks",
    "KINDS", "EnvJudgeInfo", "Judge", "JudgeItem", "JudgeResult", "env_judge_info",
    "EmbeddingJudge", "EmbeddingJudgeConfig", "reference_text",
    "LLMJudge", "LLMJudgeConfig", "LLMJudgeError",
    "Claim", "ParsedDescription", "parse_description", "truth_claims",
    "JUDGES", "ReasoningReward", "ReasoningRewardConfig", "make_judge",
    "RuleJudge", "RuleJudgeConfig", "rule_score", "score_claims",
]
