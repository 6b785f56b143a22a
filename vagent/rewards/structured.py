"""The structured (JSON-like) style of descriptions: :func:`load_structured` reads the JSON or
Python-literal value in a reply, :func:`parse_structured` turns it into claims (style 2 of
:mod:`vagent.rewards.parse`, whose docstring gives the accepted shapes).
"""

from __future__ import annotations

import ast
import json
from typing import Any, Sequence

from vagent.rewards.claims import Claim, ParsedDescription, claims_of_subject, one_or_none
from vagent.rewards.words import Vocabulary, direction_events, events, object_mentions, tokenize

_OBJECT_KEYS = ("object", "object_id", "object_type", "type", "name", "id", "kind")
_V_KEYS = ("vertical", "vertical_relation", "vertical_position", "v")
_H_KEYS = ("horizontal", "horizontal_relation", "horizontal_position", "h")
_POS_KEYS = ("position", "coordinates", "coords", "coordinate", "pos", "xyz", "location")
_LIST_KEYS = ("objects", "relations", "entities", "items", "state")


def load_structured(text: str) -> Any:
    """The JSON/Python-literal value in ``text`` (first '{' or '[' to the last matching bracket)."""
    starts = [i for i in (text.find("{"), text.find("[")) if i != -1]
    if not starts:
        return None
    start = min(starts)
    end = text.rfind("}" if text[start] == "{" else "]")
    if end <= start:
        return None
    blob = text[start:end + 1]
    for loader in (json.loads, ast.literal_eval):
        try:
            value = loader(blob)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
        if isinstance(value, (dict, list)):
            return value
    return None


def _object_of(key: object, voc: Vocabulary) -> str | None:
    mentions = object_mentions(tokenize(str(key)), voc)
    return mentions[0][0] if mentions else None


def _is_number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _pair_claim(kind: str, words: Sequence[Any], voc: Vocabulary) -> Claim:
    """One claim from a list of words such as ["above", "left"] / ["same", "right"]."""
    v: set[str] = set()
    h: set[str] = set()
    sames = []
    for slot, w in enumerate(words):
        for tok in tokenize(str(w)):
            if tok == "same":
                sames.append(slot)
                continue
            ev, _ = direction_events([tok], 0, voc)
            for e in ev:
                (v if e.axis == "v" else h).add(e.word)
    for slot in sames:  # "same" fills an axis no other word names; slot 0 = vertical first
        if not v and (slot == 0 or h) and voc.v_same:
            v.add(voc.v_same)
        elif not h and voc.h_same:
            h.add(voc.h_same)
    return Claim(kind, one_or_none(v, voc.v_same), one_or_none(h, voc.h_same))


def _n_directions(text: str, voc: Vocabulary) -> int:
    toks = tokenize(text)
    return sum(1 for t in toks if t == "same" or direction_events([t], 0, voc)[0])


def _axis_value(value: object, axis: str, voc: Vocabulary) -> str | None:
    """The relation word of one axis from a record field ("up" -> "above"); None if contradictory
    or naming the other axis; the axis's "same" when the field is absent."""
    same = voc.v_same if axis == "v" else voc.h_same
    if value is None:
        return same
    words = set()
    for tok in tokenize(str(value)):
        if tok == "same":
            words.add(same)
            continue
        for e in direction_events([tok], 0, voc)[0]:
            words.add(e.word if e.axis == axis else None)
    return next(iter(words)) if len(words) == 1 else None


def _value_claims(kind: str, value: object, voc: Vocabulary, plural: bool) -> list[Claim]:
    if isinstance(value, str):
        evs = events(tokenize(value), [], voc)
        return claims_of_subject(kind, plural, evs, voc) or [Claim(kind, None, None)]
    if isinstance(value, dict):
        rec = {str(k).lower(): v for k, v in value.items()}
        pos = next((rec[k] for k in _POS_KEYS if k in rec), None)
        position = tuple(float(x) for x in pos) if isinstance(pos, (list, tuple)) and pos and all(map(_is_number, pos)) else None
        if position is None and all(k in rec for k in ("x", "y")) and all(_is_number(rec[k]) for k in ("x", "y")):
            position = tuple(float(rec[k]) for k in ("x", "y", "z") if k in rec)
        v = next((rec[k] for k in _V_KEYS if k in rec), None)
        h = next((rec[k] for k in _H_KEYS if k in rec), None)
        if v is None and h is None:
            return [Claim(kind, None, None, position)] if position is not None else []
        return [Claim(kind, _axis_value(v, "v", voc), _axis_value(h, "h", voc), position)]
    if isinstance(value, (list, tuple)):
        if value and all(_is_number(x) for x in value):
            return [Claim(kind, None, None, tuple(float(x) for x in value))]
        if value and all(isinstance(x, str) for x in value):
            if any(_n_directions(x, voc) >= 2 for x in value):  # ["above left", "below"]: one claim each
                return [_pair_claim(kind, [x], voc) for x in value]
            return [_pair_claim(kind, value, voc)]
        out: list[Claim] = []
        for x in value:
            out += _value_claims(kind, x, voc, False)
        return out
    return []


def parse_structured(value: object, voc: Vocabulary) -> ParsedDescription:
    """The claims of a structured description (the value :func:`load_structured` read: objects with
    a name and a position or relation, nested lists and dicts up to depth 4) in ``voc``'s words."""
    claims: list[Claim] = []
    mentioned: set[str] = set()
    notes: list[str] = []

    def visit(v: object, depth: int = 0) -> None:
        if depth > 4:
            return
        if isinstance(v, list):
            for x in v:
                visit(x, depth + 1)
        elif isinstance(v, dict):
            rec = {str(k).lower(): x for k, x in v.items()}
            obj_key = next((k for k in _OBJECT_KEYS if k in rec and isinstance(rec[k], str)), None)
            if obj_key is not None:  # a record {"object": "box", "vertical": ..., "horizontal": ...}
                kind = _object_of(rec[obj_key], voc)
                if kind is None:
                    notes.append(f"unknown object {rec[obj_key]!r}")
                    return
                mentioned.add(kind)
                claims.extend(_value_claims(kind, {k: x for k, x in rec.items() if k != obj_key}, voc, False))
                return
            for key, x in v.items():
                if str(key).lower() in _LIST_KEYS:
                    visit(x, depth + 1)
                    continue
                kind = _object_of(key, voc)
                if kind is None:
                    continue
                mentioned.add(kind)
                plural = any(p for k2, p, _ in object_mentions(tokenize(str(key)), voc) if k2 == kind)
                claims.extend(_value_claims(kind, x, voc, plural))

    visit(value)
    return ParsedDescription(tuple(claims), frozenset(mentioned), "structured", tuple(notes))
