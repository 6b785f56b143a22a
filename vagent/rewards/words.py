"""The words of a judge spec, and a description's tokens read in them.

:func:`vocabulary` builds (and caches) the word tables of a :class:`~vagent.envs.base.JudgeSpec` and
an optional grid legend: object phrases -> object type (singular or plural), direction words ->
``(axis, relation word)``, legend symbols -> (shows the player?, object types). :func:`events`
reads a token stream in those tables as a list of :class:`Event` (an object, a direction word,
coordinates, a negation, any other word). The three description styles of
:mod:`vagent.rewards.parse` (symbolic, structured, natural) are read with these tables.

Direction words are the spec's relation words plus built-in synonyms (:data:`SYNONYMS`, used only
for the words a spec declares); "same row/level/height" -> vertical same, "same column" ->
horizontal same, "same position/cell/place/..." -> both, a bare "same" means nothing. Objects are
the spec's type names and synonyms (multi-word and ``snake_case`` names work; a plural adds
"s"/"es").
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Sequence

from vagent.envs.base import JudgeSpec

#: Built-in synonyms of relation words (used only for the words a spec declares).
SYNONYMS: dict[str, tuple[str, ...]] = {
    "above": ("above", "up", "upward", "upwards", "north", "top", "upper", "higher", "uphill"),
    "below": ("below", "down", "downward", "downwards", "south", "bottom", "lower", "beneath", "under",
              "underneath"),
    "left": ("left", "leftward", "leftwards", "west"),
    "right": ("right", "rightward", "rightwards", "east"),
    "ahead": ("ahead", "forward", "forwards", "front"),
    "behind": ("behind", "back", "backward", "backwards", "rear"),
}
_COMPOUNDS = {"northwest": ("north", "west"), "northeast": ("north", "east"),
              "southwest": ("south", "west"), "southeast": ("south", "east")}
_SAME_V = ("row", "rows", "level", "height", "horizontal")
_SAME_H = ("column", "columns", "col", "vertical")
_SAME_BOTH = ("position", "cell", "place", "spot", "square", "tile", "location", "spot", "point")
_NEGATIONS = frozenset({"no", "not", "none", "nothing", "without", "never", "neither", "nor", "cannot"})
_PLAYER_WORDS = frozenset({"player", "you", "agent", "me", "yourself", "myself", "robot", "avatar", "character"})
TOKEN = re.compile(r"POS\d+|[a-z]+(?:'[a-z]+)?|\d+(?:\.\d+)?")  # POS<n>: a coordinate placeholder (text is lower case)


# ---------------------------------------------------------------------------------------------
# Vocabulary
# ---------------------------------------------------------------------------------------------

@dataclass
class Vocabulary:
    """Word tables of one spec (and legend): phrase -> object type, word -> relation word."""

    spec: JudgeSpec
    legend: str | None
    #: token tuple -> (object type, plural?)
    objects: dict[tuple[str, ...], tuple[str, bool]] = field(default_factory=dict)
    #: word -> ("v" | "h", canonical word)
    directions: dict[str, tuple[str, str]] = field(default_factory=dict)
    #: grid symbol -> (shows the player?, object types shown)
    symbols: dict[str, tuple[bool, tuple[str, ...]]] = field(default_factory=dict)
    max_phrase: int = 1
    v_same: str | None = None
    h_same: str | None = None


def tokenize(text: str) -> list[str]:
    """The lower-case word and number tokens of ``text`` ("-", "_" and "/" separate words)."""
    return TOKEN.findall(text.lower().replace("-", " ").replace("_", " ").replace("/", " "))


def _name_forms(toks: tuple[str, ...], names: set[str]) -> dict[tuple[str, ...], bool]:
    """The token forms of one object name ``toks`` -> plural?: the name itself and its English plurals."""
    forms = {toks: False}
    last = toks[-1]
    if not last.endswith("s"):
        forms[toks[:-1] + (last + "s",)] = True
        if last.endswith(("x", "ch", "sh")):
            forms[toks[:-1] + (last + "es",)] = True
    else:
        # a synonym given in plural form ("holes", "boxes")
        for stem in (last[:-1], last[:-2]):
            if tuple(tokenize(stem)) and any(tuple(tokenize(n)) == toks[:-1] + (stem,) for n in names):
                forms[toks] = True
    return forms


def _add_objects(voc: Vocabulary, spec: JudgeSpec) -> None:
    """Enter every form of each object type's name and synonyms in ``voc.objects``; one form names one type."""
    for kind in spec.object_weights:
        names = {kind, *spec.synonyms.get(kind, ())}
        for name in names:
            toks = tuple(tokenize(name))
            if not toks:
                continue
            for form, plural in _name_forms(toks, names).items():
                prev = voc.objects.get(form)
                if prev is not None and prev[0] != kind:
                    raise ValueError(f"JudgeSpec: the word {' '.join(form)!r} names both '{prev[0]}' and '{kind}'; "
                                     "give each object type its own synonyms.")
                if prev is None or plural:
                    voc.objects[form] = (kind, plural)


def _build_vocabulary(spec: JudgeSpec, legend: str | None) -> Vocabulary:
    """The word tables of ``spec``: object forms, direction words, and the legend's grid symbols."""
    voc = Vocabulary(spec, legend)
    _add_objects(voc, spec)
    voc.max_phrase = max((len(k) for k in voc.objects), default=1)
    for axis, words in (("v", spec.vertical_words), ("h", spec.horizontal_words)):
        for word in words:
            if word == "same":
                if axis == "v":
                    voc.v_same = "same"
                else:
                    voc.h_same = "same"
                continue
            for syn in {word, *SYNONYMS.get(word, ())}:
                known = voc.directions.get(syn)
                if known is not None and known != (axis, word):
                    raise ValueError(f"JudgeSpec: relation word {syn!r} is on both axes; fix vertical_words/horizontal_words.")
                voc.directions[syn] = (axis, word)
    if legend:
        voc.symbols = parse_legend(legend, voc)
    return voc


_VOCAB_CACHE: dict[tuple[int, str | None], Vocabulary] = {}


def vocabulary(spec: JudgeSpec, legend: str | None = None) -> Vocabulary:
    """The (cached) word tables of ``spec`` and ``legend``."""
    key = (id(spec), legend)
    voc = _VOCAB_CACHE.get(key)
    if voc is None or voc.spec is not spec:
        voc = _build_vocabulary(spec, legend)
        if len(_VOCAB_CACHE) > 256:
            _VOCAB_CACHE.clear()
        _VOCAB_CACHE[key] = voc
    return voc


def parse_legend(legend: str, voc: Vocabulary) -> dict[str, tuple[bool, tuple[str, ...]]]:
    """``"P player, O hole, * player on the goal"`` -> ``{"P": (True, ()), "O": (False, ("hole",)),
    "*": (True, ("goal",))}``. Entries are split at commas/semicolons; the symbol is the first
    character, optionally followed by ``=``, ``:`` or ``-``. Symbols that show neither the
    player nor an object type (walls, floor) map to ``(False, ())``."""
    out: dict[str, tuple[bool, tuple[str, ...]]] = {}
    for entry in re.split(r"[,;]", legend):
        entry = entry.strip()
        if not entry:
            continue
        symbol, rest = entry[0], entry[1:].lstrip(" =:-")
        toks = tokenize(rest)
        kinds = []
        for kind, _plural, _span in object_mentions(toks, voc):
            if kind not in kinds:
                kinds.append(kind)
        out[symbol] = (any(t in _PLAYER_WORDS for t in toks), tuple(kinds))
    return out


def object_mentions(toks: Sequence[str], voc: Vocabulary) -> list[tuple[str, bool, tuple[int, int]]]:
    """(type, plural, (start, end)) of each object phrase in ``toks``, longest match first."""
    out, i = [], 0
    while i < len(toks):
        for n in range(min(voc.max_phrase, len(toks) - i), 0, -1):
            hit = voc.objects.get(tuple(toks[i:i + n]))
            if hit is not None:
                out.append((hit[0], hit[1], (i, i + n)))
                i += n
                break
        else:
            i += 1
    return out


# ---------------------------------------------------------------------------------------------
# Events: a token stream -> objects, direction words, coordinates, negations
# ---------------------------------------------------------------------------------------------

@dataclass
class Event:
    """One item of a token stream: an object mention (``kind``, ``plural``), a direction word
    (``axis`` "v"/"h", relation ``word``), coordinates (``position``), a negation, or another word."""

    what: str  # "obj" | "dir" | "pos" | "neg" | "word"
    kind: str = ""
    plural: bool = False
    axis: str = ""
    word: str = ""
    position: tuple[float, ...] | None = None


def direction_events(toks: Sequence[str], i: int, voc: Vocabulary) -> tuple[list[Event], int]:
    """Direction events starting at token ``i`` and how many tokens they used (0 = none)."""
    t = toks[i]
    if t == "same":
        nxt = toks[i + 1:i + 3]
        for j, w in enumerate(nxt, start=1):
            if w in _SAME_BOTH:
                ev = []
                if voc.v_same:
                    ev.append(Event("dir", axis="v", word=voc.v_same))
                if voc.h_same:
                    ev.append(Event("dir", axis="h", word=voc.h_same))
                return ev, j + 1
            if w in _SAME_V and voc.v_same:
                return [Event("dir", axis="v", word=voc.v_same)], j + 1
            if w in _SAME_H and voc.h_same:
                return [Event("dir", axis="h", word=voc.h_same)], j + 1
        return [], 1
    if t in _COMPOUNDS:
        ev = [Event("dir", axis=voc.directions[w][0], word=voc.directions[w][1])
              for w in _COMPOUNDS[t] if w in voc.directions]
        return ev, 1
    hit = voc.directions.get(t)
    if hit is not None:
        return [Event("dir", axis=hit[0], word=hit[1])], 1
    return [], 0


def events(toks: Sequence[str], positions: Sequence[tuple[float, ...]], voc: Vocabulary) -> list[Event]:
    """``toks`` read in ``voc`` as events, in order; a token ``POS<n>`` stands for ``positions[n]``."""
    mentions = {span[0]: (kind, plural, span) for kind, plural, span in object_mentions(toks, voc)}
    out: list[Event] = []
    i = 0
    while i < len(toks):
        t = toks[i]
        if i in mentions:
            kind, plural, (a, b) = mentions[i]
            out.append(Event("obj", kind=kind, plural=plural))
            i = b
            continue
        if t.startswith("POS"):
            out.append(Event("pos", position=positions[int(t[3:])]))
            i += 1
            continue
        if t in _NEGATIONS or t.endswith("n't"):
            out.append(Event("neg"))
            i += 1
            continue
        ev, used = direction_events(toks, i, voc)
        out.extend(ev if ev else [Event("word", word=t)] if used == 0 else [])
        i += max(used, 1)
    return out
