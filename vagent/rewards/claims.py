"""What a description claims, as records: :class:`Claim` (an object and its position relative to
the player), :class:`ParsedDescription` (the claims of one description), the claims of one object
mention from its direction words, and :func:`truth_claims` (a state's true relations as claims).

The parsers of the three description styles are :mod:`vagent.rewards.parse` (natural language,
symbolic grids) and :mod:`vagent.rewards.structured` (JSON-like values).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from vagent.rewards.words import Event, Vocabulary


@dataclass(frozen=True)
class Claim:
    """One object position a description asserts (or a state's true relation).

    ``vertical`` / ``horizontal`` are relation words of the spec, or None when the description
    contradicts itself on that axis (or states only coordinates); ``position`` optional coordinates.
    """

    object: str
    vertical: str | None
    horizontal: str | None
    position: tuple[float, ...] | None = None


@dataclass(frozen=True)
class ParsedDescription:
    """What a description claims: ``claims``; ``mentioned`` object types (with or without a
    position); ``style`` the parser recognised; ``notes`` about anything it could not use."""

    claims: tuple[Claim, ...]
    mentioned: frozenset[str]
    style: str
    notes: tuple[str, ...] = ()


def claims_of_subject(kind: str, plural: bool, evs: Sequence[Event], voc: Vocabulary) -> list[Claim]:
    """Claims of one object mention from the direction/position events attached to it."""
    dirs = [e for e in evs if e.what == "dir"]
    pos = next((e.position for e in evs if e.what == "pos"), None)
    if not dirs:
        return [Claim(kind, None, None, pos)] if pos is not None else []
    if not plural:
        v = {e.word for e in dirs if e.axis == "v"}
        h = {e.word for e in dirs if e.axis == "h"}
        return [Claim(kind, one_or_none(v, voc.v_same), one_or_none(h, voc.h_same), pos)]
    groups: list[dict[str, str]] = [{}]
    for e in dirs:
        if e.axis in groups[-1]:
            groups.append({})
        groups[-1][e.axis] = e.word
    return [Claim(kind, g.get("v", voc.v_same), g.get("h", voc.h_same)) for g in groups]


def one_or_none(words: set[str], default: str | None) -> str | None:
    if not words:
        return default
    return next(iter(words)) if len(words) == 1 else None


def truth_claims(state: Any) -> list[Claim]:
    """The state's true relations as claims: ``state["relations"]`` is a list of
    ``{"object", "vertical", "horizontal"[, "position"]}`` (the env contract for judged envs)."""
    rels = state.get("relations") if isinstance(state, dict) or hasattr(state, "get") else None
    if not isinstance(rels, (list, tuple)):
        raise ValueError(
            "state has no 'relations' list; a judged env's state() must return "
            "{'relations': [{'object', 'vertical', 'horizontal'}, ...]} (see vagent/envs/base.py JudgeSpec). "
            f"Got keys: {sorted(state) if isinstance(state, dict) else type(state).__name__}."
        )
    out = []
    for i, r in enumerate(rels):
        if not isinstance(r, dict) or "object" not in r:
            raise ValueError(f"state['relations'][{i}] must be a dict with 'object', 'vertical', 'horizontal'; got {r!r}")
        pos = r.get("position")
        out.append(Claim(str(r["object"]), r.get("vertical"), r.get("horizontal"),
                         tuple(float(x) for x in pos) if pos is not None else None))
    return out
