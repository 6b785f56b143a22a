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
objects and direction words are :mod:`vagent.rewards.words`; this module holds the natural and
symbolic styles and the entry point, :mod:`vagent.rewards.structured` the structured style, and
:mod:`vagent.rewards.claims` the :class:`Claim` records.
"""

from __future__ import annotations

import re
from typing import Iterable

from vagent.envs.base import JudgeSpec
# the claim records and the structured style live beside this module; their names stay importable from here
from vagent.rewards.claims import (  # noqa: F401
    Claim, ParsedDescription, claims_of_subject, truth_claims,
)
from vagent.rewards.structured import load_structured, parse_structured
from vagent.rewards.words import TOKEN, Event, Vocabulary, events, vocabulary

_FILLER = frozenset({"the", "a", "an", "both", "also", "all", "and", "too", "as", "well", "there", "is", "are",
                     "of", "them", "these", "those", "plus", "with"})
_COORDS = re.compile(r"[\(\[]\s*(-?\d+(?:\.\d+)?(?:\s*,\s*-?\d+(?:\.\d+)?){1,2})\s*[\)\]]")
_SENTENCE = re.compile(r"(?<!\d)\.(?!\d)|[!?;\n]+")
_PIECE = re.compile(r"[,:]|\b(?:and|or|but|then|while|whereas)\b")


# ---------------------------------------------------------------------------------------------
# Natural language
# ---------------------------------------------------------------------------------------------

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
                claims += claims_of_subject(kind, plural, attached[0], voc)
            carried = []
            for subj, evs in zip(subjects, attached):
                claims += claims_of_subject(subj.kind, subj.plural, evs, voc)
    return ParsedDescription(tuple(claims), frozenset(mentioned), "natural")


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
