"""The LLM judge's prompts and the reading of its answers (pure functions): the true state as text,
the ``yesno`` and ``parse`` prompts, the YES/NO and JSON answers scored, and the cache key of a
request. :class:`vagent.rewards.llm.LLMJudge` sends them; :mod:`vagent.rewards.llm` re-exports the names.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Mapping

from vagent.rewards.base import JudgeItem
from vagent.rewards.parse import load_structured, parse_structured, truth_claims
from vagent.rewards.rule import RuleJudgeConfig, score_claims
from vagent.rewards.words import vocabulary

_SYSTEM = ("You are a strict, careful judge of descriptions of game states. Positions are relative to "
           "the player: vertical is above/below/same (same row), horizontal is left/right/same (same column).")


def state_text(state: Mapping[str, Any], legend: str | None = None) -> str:
    """The true state in few tokens: one line per relation (with coordinates when known), then the
    grid when the env has a legend for it."""
    lines = []
    for r in truth_claims(state):
        where = f"{r.vertical}, {r.horizontal}" if r.vertical is not None else "?"
        if r.position is not None:
            where += f"; position ({', '.join(f'{x:g}' for x in r.position)})"
        lines.append(f"- {r.object}: {where}")
    text = "Objects (vertical, horizontal) relative to the player:\n" + ("\n".join(lines) or "- none")
    grid = state.get("grid")
    if legend and isinstance(grid, (list, tuple)) and all(isinstance(row, str) for row in grid):
        text += f"\nGrid (legend: {legend}; row 0 is the top):\n" + "\n".join(grid)
    return text


def yesno_messages(item: JudgeItem) -> list[dict[str, str]]:
    """The YES/NO prompt: the true state (:func:`state_text`) and the description."""
    what = "the current state" if item.kind == "grounding" else "the state after the agent's actions"
    user = (
        f"Environment: {item.env_name or 'a grid game'}\nTrue state. {state_text(item.state, item.legend)}\n\n"
        f"The agent's description of {what}:\n\"\"\"\n{item.description}\n\"\"\"\n\n"
        "Does the description state every important object's position correctly? "
        "Answer with exactly one word: YES or NO."
    )
    return [{"role": "system", "content": _SYSTEM}, {"role": "user", "content": user}]


def parse_messages(item: JudgeItem) -> list[dict[str, str]]:
    """The parse prompt: the description only (no state), the spec's vocabulary and the format."""
    spec = item.spec
    types = ", ".join(f"{t} (also called: {', '.join(s for s in spec.synonyms.get(t, ()) if s != t) or '-'})"
                      for t in spec.object_weights)
    legend = f"If the description is a grid, the legend is: {item.legend} (row 0 is the top).\n" if item.legend else ""
    user = (
        f"Object types: {types}.\n{legend}"
        "Convert the description below into a JSON list with one item per object it locates: "
        f'{{"object": <type>, "vertical": <{"|".join(spec.vertical_words)}>, '
        f'"horizontal": <{"|".join(spec.horizontal_words)}>}}, positions relative to the player. '
        "Output only the JSON list ([] if it locates nothing).\n"
        f"Description:\n\"\"\"\n{item.description}\n\"\"\""
    )
    return [{"role": "system", "content": _SYSTEM}, {"role": "user", "content": user}]


_YES_NO = re.compile(r"\b(yes|no)\b", re.IGNORECASE)


def parse_yesno(answer: str) -> float:
    """1.0 for YES, 0.0 for NO (the first of the two words in the answer); ValueError otherwise."""
    m = _YES_NO.search(answer or "")
    if m is None:
        raise ValueError(f"no YES/NO in the judge's answer: {answer[:80]!r}")
    return 1.0 if m.group(1).lower() == "yes" else 0.0


def score_parsed_answer(answer: str, item: JudgeItem, rule: RuleJudgeConfig | None = None) -> tuple[float, int]:
    """(score, n_claims) of a parse-mode answer; ValueError if it holds no JSON list/object."""
    value = load_structured(answer or "")
    if value is None:
        raise ValueError(f"no JSON in the judge's answer: {(answer or '')[:80]!r}")
    parsed = parse_structured(value, vocabulary(item.spec, item.legend))
    score, _ = score_claims(parsed.claims, truth_claims(item.state), item.spec, rule)
    return score, len(parsed.claims)


def cache_key(model: str, mode: str, temperature: float, max_tokens: int, messages: list[dict[str, str]]) -> str:
    blob = json.dumps([model, mode, temperature, max_tokens, messages], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()
