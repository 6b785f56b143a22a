"""Anti-hacking: guards against descriptions that game the judge (docs/algorithms.md reference section 7).

Two guards, both on by default and both counted in the metrics:

1. :class:`FrequencyTracker` (VAGEN legacy's filter): over the last ``window`` judged
   descriptions of one kind, the ``top_k`` most frequent ones that score below ``threshold`` get
   the reward ``penalty`` (default -0.1) INSTEAD of ``weight x score``. Templated text the policy
   repeats whatever the state is ("the goal is below you") is the typical hack. Deviation from
   legacy: a description must also have been seen at least ``min_count`` times in the window
   (otherwise, early in training, any of the first five distinct descriptions would be "top 5").
   Descriptions are compared after lower-casing and collapsing whitespace.
2. :func:`rule_checks`: a description must mention every *required* object type (present in the
   state and weighted at least ``required_weight`` in the spec: both Sokoban types, FrozenLake's
   goal) and must not be longer than ``max_chars``. A failing description's score counts as 0.
   This stops a judge (an LLM or embedding one especially) from rewarding text that talks around
   the objects, and stops the policy from padding descriptions.
"""

from __future__ import annotations

import re
from collections import Counter, deque
from dataclasses import dataclass

from vagent.config import ConfigError
from vagent.rewards.base import JudgeItem
from vagent.rewards.parse import parse_description, truth_claims


@dataclass
class AntiHackingConfig:
    """Options of the anti-hacking guards."""

    #: turn on the frequent-description penalty
    frequency_penalty: bool = True
    #: how many recent judged descriptions (per kind) the tracker remembers
    window: int = 1000
    #: how many of the most frequent descriptions are candidates for the penalty
    top_k: int = 5
    #: a frequent description scoring below this gets the penalty instead of its reward
    threshold: float = 0.7
    #: the reward given instead (VAGEN legacy: -0.1)
    penalty: float = -0.1
    #: times a description must occur in the window to count as frequent
    min_count: int = 5
    #: turn on the rule checks (required entities mentioned, length)
    rule_checks: bool = True
    #: spec weight at or above which a type present in the state must be mentioned (0 = all types)
    required_weight: float = 0.5
    #: descriptions longer than this many characters score 0 (0 = no limit)
    max_chars: int = 1000

    def __post_init__(self) -> None:
        if self.window < 1 or self.top_k < 1 or self.min_count < 1:
            raise ConfigError(
                f"anti_hacking: window, top_k and min_count must be >= 1, got window={self.window}, "
                f"top_k={self.top_k}, min_count={self.min_count}. Turn the guard off with frequency_penalty: false."
            )
        if not 0.0 <= self.threshold <= 1.0:
            raise ConfigError(f"anti_hacking.threshold: a score threshold in [0, 1], got {self.threshold}.")
        if self.max_chars < 0:
            raise ConfigError(f"anti_hacking.max_chars: expected >= 0 (0 = no limit), got {self.max_chars}.")


def normalize(text: str) -> str:
    """The form descriptions are compared in: lower case, whitespace collapsed."""
    return re.sub(r"\s+", " ", text.strip().lower())


class FrequencyTracker:
    """The most frequent recent descriptions; :meth:`observe` says whether to penalize one."""

    def __init__(self, window: int = 1000, top_k: int = 5, threshold: float = 0.7, min_count: int = 5) -> None:
        self.window, self.top_k, self.threshold, self.min_count = window, top_k, threshold, min_count
        self._recent: deque[str] = deque()
        self._counts: Counter[str] = Counter()

    def observe(self, description: str, score: float) -> bool:
        """Record ``description``; True if it is now among the ``top_k`` most frequent of the
        window (seen >= ``min_count`` times) and ``score < threshold``."""
        key = normalize(description)
        self._recent.append(key)
        self._counts[key] += 1
        if len(self._recent) > self.window:
            old = self._recent.popleft()
            self._counts[old] -= 1
            if self._counts[old] == 0:
                del self._counts[old]
        if score >= self.threshold or self._counts[key] < self.min_count:
            return False
        return key in self.top()

    def top(self) -> set[str]:
        """The ``top_k`` most frequent descriptions (ties broken by first occurrence order)."""
        return {k for k, _ in self._counts.most_common(self.top_k)}

    def count(self, description: str) -> int:
        return self._counts.get(normalize(description), 0)


@dataclass(frozen=True)
class CheckResult:
    """Outcome of :func:`rule_checks`: ``missing`` required types not mentioned; ``too_long``."""

    missing: tuple[str, ...] = ()
    too_long: bool = False

    @property
    def ok(self) -> bool:
        return not self.missing and not self.too_long

    @property
    def reason(self) -> str:
        """Why the check failed ("" when it passed), e.g. ``"does not mention goal"``."""
        if self.too_long:
            return "longer than anti_hacking.max_chars"
        return f"does not mention {', '.join(self.missing)}" if self.missing else ""


def required_types(item: JudgeItem, required_weight: float) -> tuple[str, ...]:
    """Object types present in ``item.state`` whose spec weight is >= ``required_weight``."""
    present = {c.object for c in truth_claims(item.state)}
    return tuple(t for t, w in item.spec.object_weights.items() if t in present and w >= required_weight)


def rule_checks(item: JudgeItem, config: AntiHackingConfig) -> CheckResult:
    """Check that ``item.description`` names the required objects and is not absurdly long."""
    too_long = config.max_chars > 0 and len(item.description) > config.max_chars
    if too_long:  # do not even parse it
        return CheckResult((), True)
    mentioned = parse_description(item.description, item.spec, item.legend).mentioned
    missing = tuple(t for t in required_types(item, config.required_weight) if t not in mentioned)
    return CheckResult(missing, False)
