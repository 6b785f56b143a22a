"""ViGoRL's grounded reasoning replies: the parser, the zoom tool call and the rewards.

Grammar of one reply (docs/algorithms.md reference section 10), surrounding whitespace allowed::

    answer turn:  <think> T </think> <answer> A </answer>
    tool turn:    <think> T </think> <tool_call> J </tool_call>       (multi-turn env only)

with ``T`` free text citing image points as ``(x, y)`` and ``J`` the JSON object
``{"name": "search_coordinate", "arguments": {"coordinate": [x, y]}}``. The format is correct
when ``<think>`` and exactly one of ``<answer>`` / ``<tool_call>`` each appear exactly once, in
that order, non-empty, with nothing but whitespace outside them; a tool call must also be valid
(see :func:`parse_tool_call`). Tags of VAGEN's other formats inside ``<think>`` are plain text.

Points: every ``(x, y)`` with integer ``x`` and ``y`` inside ``<think>`` is a citation, in pixels
of the image as the model sees it (the resized image; x to the right, y down, (0, 0) the
top-left pixel). A citation outside ``0 <= x < width, 0 <= y < height`` is INVALID: it is kept in
``GroundedReply.invalid_points`` (and counted in the env's info) but does not count as grounding.
Decimal or negative-looking numbers like ``(1.5, 2)`` are not citations.

Tool-call stop: the training recipes stop generation at ``</answer>`` only, so a model may keep
writing after ``</tool_call>``. With ``allow_tool=True`` the parser cuts the reply right after the
first ``</tool_call>`` (as a stop string would) before checking the grammar.

:func:`parse_grounded` never raises on any input (a hypothesis property test checks it).

Rewards (pure functions, docs/algorithms.md reference section 10; the ViGoRL reward functions
``point_in_bbox_grounded_thinking`` / ``*_multicrop``):

- single turn: ``r = w_acc * acc + w_fmt * fmt * g`` with ``w_acc = w_fmt = 0.5``; ``g = 1`` when
  the thinking cites at least one valid point;
- multi turn: ``r = w_acc * acc + w_fmt * fmt * (1 + bonus * (n_distinct - 1))`` with
  ``w_acc = 0.6, w_fmt = 0.4, bonus = 0.2`` where ``n_distinct`` counts zooms at least
  ``min_distance`` (10) pixels from every earlier counted zoom. Deviation: the bonus is OFF by
  default here (``bonus_enabled=False``): it pays for zooming anywhere, a known hacking lever
  (ViGoRL always adds it).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any, Sequence

TOOL_NAME = "search_coordinate"
#: ``(x, y)`` with optional signs and spaces; at most 9 digits so int() is always cheap
POINT_RE = re.compile(r"\(\s*([+-]?\d{1,9})\s*,\s*([+-]?\d{1,9})\s*\)")
_ANSWER_POINT_RE = re.compile(r"\(?\s*([+-]?\d{1,9})\s*,\s*([+-]?\d{1,9})\s*\)?")
_TAGS = ("think", "answer", "tool_call")

Point = tuple[int, int]


@dataclass(frozen=True)
class ToolCall:
    """A valid ``search_coordinate`` call: zoom at ``(x, y)`` (pixels of the shown image)."""

    name: str
    x: int
    y: int

    def to_json(self) -> str:
        """The call as the model writes it inside ``<tool_call>``."""
        return json.dumps({"name": self.name, "arguments": {"coordinate": [self.x, self.y]}})


@dataclass(frozen=True)
class GroundedReply:
    """The parser's verdict on one reply.

    ``answer`` is the stripped ``<answer>`` content; when the format fails it is the best-effort
    content of the first ``<answer>...</answer>`` (ViGoRL scores accuracy from it regardless of
    the format). ``points`` are the valid citations in ``<think>`` in order, ``invalid_points``
    the out-of-bounds ones; ``error`` says why the format failed (None if correct).
    """

    format_ok: bool
    think: str = ""
    answer: str = ""
    points: tuple[Point, ...] = ()
    invalid_points: tuple[Point, ...] = ()
    tool_call: ToolCall | None = None
    error: str | None = None

    @property
    def grounded(self) -> bool:
        """``g`` of the single-turn reward: at least one valid point in the thinking."""
        return len(self.points) >= 1

    @property
    def kind(self) -> str:
        """``"answer"``, ``"tool"`` (a valid tool call) or ``"invalid"`` (format failed)."""
        if not self.format_ok:
            return "invalid"
        return "tool" if self.tool_call is not None else "answer"

    def as_parsed_response(self) -> dict[str, Any]:
        """The fields of ``vagent.envs.formats.ParsedResponse`` (what the rollout records as
        ``Turn.parsed``); the action is the answer or ``search_coordinate(x, y)``."""
        if self.tool_call is not None and self.format_ok:
            actions: tuple[str, ...] = (f"{TOOL_NAME}({self.tool_call.x}, {self.tool_call.y})",)
        else:
            actions = (self.answer,) if self.format_ok else ()
        return {"format_ok": self.format_ok, "think": self.think, "observation": "", "reasoning": "",
                "prediction": "", "answer": self.answer, "actions": actions, "error": self.error,
                "n_dropped_actions": 0}


# ---------------------------------------------------------------------------------------------
# Points
# ---------------------------------------------------------------------------------------------

def in_bounds(point: Point, width: int, height: int) -> bool:
    """Whether ``point`` is a pixel of a ``width`` x ``height`` image."""
    x, y = point
    return 0 <= x < width and 0 <= y < height


def find_points(text: str, width: int, height: int) -> tuple[tuple[Point, ...], tuple[Point, ...]]:
    """(valid, invalid) integer ``(x, y)`` citations of ``text``, in order of appearance."""
    valid, invalid = [], []
    for m in POINT_RE.finditer(text):
        p = (int(m.group(1)), int(m.group(2)))
        (valid if in_bounds(p, width, height) else invalid).append(p)
    return tuple(valid), tuple(invalid)


def parse_point_answer(answer: str) -> Point | None:
    """The point of an answer ``"(x, y)"`` (parentheses optional, nothing else); else None."""
    if not isinstance(answer, str):
        return None
    m = _ANSWER_POINT_RE.fullmatch(answer.strip())
    if m is None:
        return None
    return int(m.group(1)), int(m.group(2))


def format_point(point: Sequence[int]) -> str:
    """``(x, y)`` as the model writes it."""
    return f"({int(point[0])}, {int(point[1])})"


# ---------------------------------------------------------------------------------------------
# Tool calls
# ---------------------------------------------------------------------------------------------

def _integer(v: Any) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and math.isfinite(v) and v.is_integer():
        return int(v)
    return None


def parse_tool_call(body: str, width: int, height: int) -> ToolCall | str:
    """The ``<tool_call>`` content as a :class:`ToolCall`, or an error string saying what is wrong.

    Expected: ``{"name": "search_coordinate", "arguments": {"coordinate": [x, y]}}`` with integer
    pixels inside the shown image. Never raises.
    """
    expected = f'expected {{"name": "{TOOL_NAME}", "arguments": {{"coordinate": [x, y]}}}}'
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError) as exc:
        return f"tool call is not valid JSON ({str(exc)[:80]}); {expected}"
    if not isinstance(obj, dict):
        return f"tool call must be a JSON object, got {type(obj).__name__}; {expected}"
    name = obj.get("name")
    if name != TOOL_NAME:
        return f"unknown tool {str(name)[:40]!r}: the only tool is '{TOOL_NAME}'; {expected}"
    args = obj.get("arguments")
    if not isinstance(args, dict):
        return f"tool call lacks an \"arguments\" object; {expected}"
    if "coordinate" not in args:
        return f"tool call lacks arguments.coordinate; {expected}"
    coord = args["coordinate"]
    if not isinstance(coord, list) or len(coord) != 2:
        return f"arguments.coordinate must be a list of two integers [x, y], got {str(coord)[:40]}"
    x, y = _integer(coord[0]), _integer(coord[1])
    if x is None or y is None:
        return f"arguments.coordinate must hold two integer pixels [x, y], got {str(coord)[:40]}"
    if not in_bounds((x, y), width, height):
        return (f"coordinate ({x}, {y}) is outside the image: expected 0 <= x < {width} and "
                f"0 <= y < {height} (pixels of the first, full image)")
    return ToolCall(TOOL_NAME, x, y)


# ---------------------------------------------------------------------------------------------
# The reply parser
# ---------------------------------------------------------------------------------------------

def _first_block(text: str, tag: str) -> str | None:
    o = text.find(f"<{tag}>")
    if o == -1:
        return None
    c = text.find(f"</{tag}>", o + len(tag) + 2)
    return None if c == -1 else text[o + len(tag) + 2: c].strip()


def _strict(text: str, width: int, height: int, allow_tool: bool) -> dict[str, Any] | str:
    counts = {t: (text.count(f"<{t}>"), text.count(f"</{t}>")) for t in _TAGS}
    if counts["think"] != (1, 1):
        n_open, n_close = counts["think"]
        if counts["think"] == (0, 0):
            return "missing <think>...</think>"
        return f"<think> must appear exactly once (found {n_open} <think> and {n_close} </think>)"
    has_answer, has_tool = counts["answer"] != (0, 0), counts["tool_call"] != (0, 0)
    if has_tool and not allow_tool:
        return "<tool_call> is not available here: answer with <think>...</think><answer>...</answer>"
    if has_answer and has_tool:
        return "a reply holds either <answer> or <tool_call>, not both"
    if not has_answer and not has_tool:
        return "missing <answer>...</answer>" + (" (or <tool_call>...</tool_call>)" if allow_tool else "")
    final = "answer" if has_answer else "tool_call"
    if counts[final] != (1, 1):
        return f"<{final}> must appear exactly once (found {counts[final][0]} <{final}> and {counts[final][1]} </{final}>)"
    t0, t1 = text.find("<think>"), text.find("</think>")
    f0, f1 = text.find(f"<{final}>"), text.find(f"</{final}>")
    if not t0 < t1 < f0 < f1:
        return f"expected <think>...</think> followed by <{final}>...</{final}>, in that order"
    outside = (text[:t0], text[t1 + 8: f0], text[f1 + len(final) + 3:])
    for piece in outside:
        if piece.strip():
            return f"text outside the tags: {piece.strip()[:40]!r}"
    think = text[t0 + 7: t1].strip()
    body = text[f0 + len(final) + 2: f1].strip()
    if not think:
        return "<think> is empty"
    if not body:
        return f"<{final}> is empty"
    out: dict[str, Any] = {"think": think}
    if final == "answer":
        out["answer"] = body
    else:
        call = parse_tool_call(body, width, height)
        if isinstance(call, str):
            return call
        out["tool_call"] = call
    return out


def parse_grounded(text: object, width: int, height: int, *, allow_tool: bool = False) -> GroundedReply:
    """Parse a reply (see the module docstring) for an image of ``width`` x ``height`` pixels.

    Never raises on any input; ``width``/``height`` must be positive ints (a programming error
    otherwise: ValueError).
    """
    if not (isinstance(width, int) and isinstance(height, int) and width > 0 and height > 0):
        raise ValueError(f"parse_grounded needs the image size as positive ints, got {width!r} x {height!r}")
    if not isinstance(text, str):
        if isinstance(text, (bytes, bytearray)):
            text = bytes(text).decode("utf-8", errors="replace")
        else:
            return GroundedReply(False, error=f"reply is not text (got {type(text).__name__})")
    if allow_tool:
        end = text.find("</tool_call>")
        if end != -1:
            text = text[: end + len("</tool_call>")]
    result = _strict(text, width, height, allow_tool)
    if isinstance(result, str):
        think = _first_block(text, "think") or ""
        valid, invalid = find_points(think, width, height)
        return GroundedReply(False, think=think, answer=_first_block(text, "answer") or "", points=valid,
                             invalid_points=invalid, error=result)
    valid, invalid = find_points(result["think"], width, height)
    return GroundedReply(True, think=result["think"], answer=result.get("answer", ""), points=valid,
                         invalid_points=invalid, tool_call=result.get("tool_call"))


def render_reply(think: str, answer: str | None = None, tool_call: ToolCall | None = None) -> str:
    """Write a reply: ``<think>..</think><answer>..</answer>`` or ``<think>..</think><tool_call>..</tool_call>``."""
    if (answer is None) == (tool_call is None):
        raise ValueError("render_reply needs exactly one of answer and tool_call")
    if tool_call is not None:
        return f"<think>{think}</think><tool_call>{tool_call.to_json()}</tool_call>"
    return f"<think>{think}</think><answer>{answer}</answer>"


# ---------------------------------------------------------------------------------------------
# Rewards
# ---------------------------------------------------------------------------------------------

def single_turn_reward(accuracy: float, format_ok: bool, grounded: bool, *, w_accuracy: float = 0.5,
                       w_format: float = 0.5) -> float:
    """``r = w_acc * acc + w_fmt * fmt * g`` (ViGoRL single turn: 0.5 / 0.5)."""
    return float(w_accuracy * accuracy + w_format * float(bool(format_ok)) * float(bool(grounded)))


def distinct_zooms(points: Sequence[Point], min_distance: float = 10.0) -> int:
    """How many zoom points are at least ``min_distance`` pixels (Euclidean) from every point
    counted before them, scanning in order (ViGoRL's rule)."""
    kept: list[Point] = []
    for p in points:
        if all(math.hypot(p[0] - q[0], p[1] - q[1]) >= min_distance for q in kept):
            kept.append(p)
    return len(kept)


def multi_turn_reward(accuracy: float, format_ok: bool, n_distinct: int, *, w_accuracy: float = 0.6,
                      w_format: float = 0.4, zoom_bonus: float = 0.2, bonus_enabled: bool = False) -> float:
    """``r = w_acc * acc + w_fmt * fmt * (1 + bonus * max(0, n_distinct - 1))``; the bonus term
    only when ``bonus_enabled`` (ViGoRL multi turn: 0.6 / 0.4 / 0.2, bonus always on)."""
    extra = zoom_bonus * max(0, int(n_distinct) - 1) if bonus_enabled else 0.0
    return float(w_accuracy * accuracy + w_format * float(bool(format_ok)) * (1.0 + extra))


__all__ = [
    "TOOL_NAME", "POINT_RE", "Point", "ToolCall", "GroundedReply", "in_bounds", "find_points",
    "parse_point_answer", "format_point", "parse_tool_call", "parse_grounded", "render_reply",
    "single_turn_reward", "distinct_zooms", "multi_turn_reward",
]
