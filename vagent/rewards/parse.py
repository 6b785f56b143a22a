"""Deterministic parser: a state description -> the object positions it claims.

The rule judge scores what a description *claims* (:class:`Claim`: an object type and its
position relative to the player, ``(vertical, horizontal)``, optionally coordinates) against the
state. :func:`parse_description` recognises three styles, tried in this order:

1. **symbolic**: a block of >= 2 lines made only of the env's grid symbols (``LEGEND``, e.g.
   ``"P player, O hole, G goal"``). Exactly one player symbol is required; every other symbol's
   cell gives a claim relative to it (row 0 at the top: a smaller row is "above").
2. **structured**: JSON (or a Python literal) such as ``{"box": ["above", "left"]}``,
   ``{"hole": [["above", "left"], ["same", "right"]]}``, ``{"goal": {"vertical": "below",
   "horizontal": "same"}}``, ``{"cube": [120, 40, 15]}`` (coordinates), or a list of records
   ``[{"object": "box", "vertical": "above", "horizontal": "left"}]`` (also VAGEN's
   ``object_id`` / ``vertical_relation`` / ``horizontal_relation`` keys). In a ``[v, h]`` pair the
   word ``same`` fills the axis the other word does not name (slot order breaks ties).
3. **natural** language. Sentences split at ``. ! ? ;`` and new lines; a sentence splits into
   pieces at ``,`` ``:`` and the words and/or/but/then/while/whereas, and a piece that names no
   object joins the clause before it (or the first clause, at the start of a sentence). In a
   clause, direction words after an object belong to it; words before the first object belong to
   the first object. A clause made only of object names ("the box and the target are above you")
   shares the next clause's directions.

Rules for direction words (the vocabulary is the spec's relation words plus built-in synonyms:
up/north/top/upper/higher -> above, down/south/bottom/lower/beneath/under -> below,
west -> left, east -> right, forward/front -> ahead, back/backward -> behind, when the spec
uses those words):

- "same row/level/height" -> vertical same; "same column" -> horizontal same; "same
  position/cell/place/spot/square/tile/location" -> both; a bare "same" means nothing.
- A singular object gets ONE position. Two different words on one axis ("above below", "left
  or right", "above/below") make that axis *contradictory* (None): it matches nothing. Repeating
  every direction word therefore earns no credit.
- A plural object ("holes") may take several positions: a new one starts when an axis that is
  already set appears again ("holes above-left and below-right" -> two claims).
- An axis a claim leaves unstated is "same" ("the goal is below you" = directly below).
- A clause with a negation (no, not, none, nothing, without, never, n't) claims nothing.
- Counts ("two holes") are ignored: each position is one object. Coordinates written as
  ``(x, y[, z])`` after an object are its position.

Objects are recognised by the spec's type names and synonyms (multi-word and ``snake_case``
names work; a plural adds "s"/"es"). Mentions without a position still count as *mentioned*
(the anti-hacking entity check) but claim nothing. The word tables and the reading of tokens as
objects and direction words are :mod:`vagent.rewards.words`; this module holds the three styles.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from vagent.envs.base import JudgeSpec
from vagent.rewards.words import (TOKEN, Event, Vocabulary, direction_events, events, object_mentions, tokenize,
                                  vocabulary)

_FILLER = frozenset({"the", "a", "an", "both", "also", "all", "and", "too", "as", "well", "there", "is", "are",
                     "of", "them", "these", "those", "plus", "with"})
_COORDS = re.compile(r"[\(\[]\s*(-?\d+(?:\.\d+)?(?:\s*,\s*-?\d+(?:\.\d+)?){1,2})\s*[\)\]]")
_SENTENCE = re.compile(r"(?<!\d)\.(?!\d)|[!?;\n]+")
_PIECE = re.compile(r"[,:]|\b(?:and|or|but|then|while|whereas)\b")


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


# ---------------------------------------------------------------------------------------------
# Natural language
# ---------------------------------------------------------------------------------------------

def _claims_of_subject(kind: str, plural: bool, evs: Sequence[Event], voc: Vocabulary) -> list[Claim]:
    """Claims of one object mention from the direction/position events attached to it."""
    dirs = [e for e in evs if e.what == "dir"]
    pos = next((e.position for e in evs if e.what == "pos"), None)
    if not dirs:
        return [Claim(kind, None, None, pos)] if pos is not None else []
    if not plural:
        v = {e.word for e in dirs if e.axis == "v"}
        h = {e.word for e in dirs if e.axis == "h"}
        return [Claim(kind, _one_or_none(v, voc.v_same), _one_or_none(h, voc.h_same), pos)]
    groups: list[dict[str, str]] = [{}]
    for e in dirs:
        if e.axis in groups[-1]:
            groups.append({})
        groups[-1][e.axis] = e.word
    return [Claim(kind, g.get("v", voc.v_same), g.get("h", voc.h_same)) for g in groups]


def _one_or_none(words: set[str], default: str | None) -> str | None:
    if not words:
        return default
    return next(iter(words)) if len(words) == 1 else None


def _clauses(sentence: str, positions: list[tuple[float, ...]], voc: Vocabulary) -> list[list[Event]]:
    """Split a sentence into clauses (lists of events), each with at least one object."""
    clauses: list[list[Event]] = []
    pre: list[Event] = []
    for piece in _PIECE.split(sentence):
        evs = events(TOKEN.findall(piece), positions, voc)
        if any(e.what == "obj" for e in evs):
            clauses.append(pre + evs)
            pre = []
        elif clauses:
            clauses[-1].extend(evs)
        else:
            pre.extend(evs)
    return clauses


def _natural(text: str, voc: Vocabulary) -> ParsedDescription:
    positions: list[tuple[float, ...]] = []

    def _pos(m: re.Match) -> str:
        positions.append(tuple(float(x) for x in m.group(1).split(",")))
        return f" POS{len(positions) - 1} "

    text = _COORDS.sub(_pos, text.lower()).replace("-", " ").replace("_", " ").replace("/", " ")
    claims: list[Claim] = []
    mentioned: set[str] = set()
    for sentence in _SENTENCE.split(text):
        carried: list[tuple[str, bool]] = []
        for clause in _clauses(sentence, positions, voc):
            subjects = [e for e in clause if e.what == "obj"]
            mentioned.update(e.kind for e in subjects)
            if any(e.what == "neg" for e in clause):
                carried = []
                continue
            located = [e for e in clause if e.what in ("dir", "pos")]
            if not located and all(e.what == "obj" or (e.what == "word" and e.word in _FILLER) for e in clause):
                carried += [(e.kind, e.plural) for e in subjects]  # "the box and the target are ..."
                continue
            # attach events: before the first subject -> first subject; after subject i -> subject i
            attached: list[list[Event]] = [[] for _ in subjects]
            idx = -1
            for e in clause:
                if e.what == "obj":
                    idx += 1
                elif e.what in ("dir", "pos"):
                    attached[max(idx, 0)].append(e)
            for (kind, plural) in carried:
                claims += _claims_of_subject(kind, plural, attached[0], voc)
            carried = []
            for subj, evs in zip(subjects, attached):
                claims += _claims_of_subject(subj.kind, subj.plural, evs, voc)
    return ParsedDescription(tuple(claims), frozenset(mentioned), "natural")


# ---------------------------------------------------------------------------------------------
# Structured (JSON-like)
# ---------------------------------------------------------------------------------------------

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


def _object_of(key: Any, voc: Vocabulary) -> str | None:
    mentions = object_mentions(tokenize(str(key)), voc)
    return mentions[0][0] if mentions else None


def _is_number(x: Any) -> bool:
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
    return Claim(kind, _one_or_none(v, voc.v_same), _one_or_none(h, voc.h_same))


def _n_directions(text: str, voc: Vocabulary) -> int:
    toks = tokenize(text)
    return sum(1 for t in toks if t == "same" or direction_events([t], 0, voc)[0])


def _axis_value(value: Any, axis: str, voc: Vocabulary) -> str | None:
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


def _value_claims(kind: str, value: Any, voc: Vocabulary, plural: bool) -> list[Claim]:
    if isinstance(value, str):
        evs = events(tokenize(value), [], voc)
        return _claims_of_subject(kind, plural, evs, voc) or [Claim(kind, None, None)]
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


def parse_structured(value: Any, voc: Vocabulary) -> ParsedDescription:
    """The claims of a structured description (the value :func:`load_structured` read: objects with
    a name and a position or relation, nested lists and dicts up to depth 4) in ``voc``'s words."""
    claims: list[Claim] = []
    mentioned: set[str] = set()
    notes: list[str] = []

    def visit(v: Any, depth: int = 0) -> None:
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


# ---------------------------------------------------------------------------------------------
# Symbolic (grid)
# ---------------------------------------------------------------------------------------------

def _grid_block(text: str, symbols: Iterable[str]) -> list[str] | None:
    """The longest run (>= 2) of consecutive lines made only of legend symbols (spaces between
    single symbols are allowed: ``"P _ O"``)."""
    allowed = set(symbols)
    best: list[str] = []
    run: list[str] = []
    for raw in text.splitlines() + [""]:
        line = raw.strip().strip("`")
        cells = line.split()
        if len(cells) > 1 and all(len(c) == 1 for c in cells):
            line = "".join(cells)
        if len(line) >= 2 and set(line) <= allowed:
            run.append(line)
            continue
        if len(run) > len(best):
            best = run
        run = []
    return best if len(best) >= 2 else None


def _symbolic(rows: list[str], voc: Vocabulary) -> ParsedDescription:
    players = [(r, c) for r, row in enumerate(rows) for c, s in enumerate(row) if voc.symbols[s][0]]
    mentioned = frozenset(k for row in rows for s in row for k in voc.symbols[s][1])
    if len(players) != 1:
        return ParsedDescription((), mentioned, "symbolic", (f"grid shows {len(players)} player symbols, expected 1",))
    pr, pc = players[0]
    v_words = ("above", "below") if {"above", "below"} <= set(voc.spec.vertical_words) else None
    h_words = ("left", "right") if {"left", "right"} <= set(voc.spec.horizontal_words) else None
    if v_words is None or h_words is None or not voc.v_same or not voc.h_same:
        return ParsedDescription((), mentioned, "symbolic", ("the spec's relation words are not above/below/left/right/same",))
    claims = []
    for r, row in enumerate(rows):
        for c, s in enumerate(row):
            for kind in voc.symbols[s][1]:
                v = v_words[0] if r < pr else v_words[1] if r > pr else voc.v_same
                h = h_words[0] if c < pc else h_words[1] if c > pc else voc.h_same
                claims.append(Claim(kind, v, h))
    return ParsedDescription(tuple(claims), mentioned, "symbolic")


# ---------------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------------

def parse_description(text: str, spec: JudgeSpec, legend: str | None = None) -> ParsedDescription:
    """Parse a description into claims (see the module docstring). Pure; never raises on any text."""
    if not isinstance(text, str) or not text.strip():
        return ParsedDescription((), frozenset(), "empty")
    voc = vocabulary(spec, legend)
    if voc.symbols:
        rows = _grid_block(text, voc.symbols)
        if rows is not None:
            return _symbolic(rows, voc)
    value = load_structured(text)
    if value is not None:
        parsed = parse_structured(value, voc)
        if parsed.claims or parsed.mentioned:
            return parsed
    return _natural(text, voc)


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
