"""The five visual-state reasoning formats of VAGEN (docs/algorithms.md reference section 2) and their parser.

| name | the model must answer |
|---|---|
| ``no_think`` | ``<answer>...</answer>`` |
| ``free_think`` | ``<think>...</think><answer>...</answer>`` |
| ``grounding`` | ``<think><observation>...</observation><reasoning>...</reasoning></think><answer>...</answer>`` |
| ``worldmodeling`` | ``<think><reasoning>...</reasoning><prediction>...</prediction></think><answer>...</answer>`` |
| ``grounding_worldmodeling`` | ``<think><observation>..</observation><reasoning>..</reasoning><prediction>..</prediction></think><answer>..</answer>`` |

:func:`parse_response` accepts any string and never raises. The format is correct when the
required tags each appear exactly once, properly nested and in order, every required field is
non-empty, no tag of another field appears, and nothing but whitespace stands outside the tags.
Actions are extracted only from a correct response (an incorrect one executes nothing, as in
VAGEN), split by the env's separator and capped at ``max_actions_per_turn``.

State descriptions may be natural language, structured (JSON-like) or symbolic (a grid); the
system prompt tells the model which (``description_style``).
"""

from __future__ import annotations

from dataclasses import dataclass

FORMATS = ("no_think", "free_think", "grounding", "worldmodeling", "grounding_worldmodeling")
DESCRIPTION_STYLES = ("natural", "structured", "symbolic")
FIELDS = ("think", "observation", "reasoning", "prediction", "answer")

# The tags each format requires inside <think>, in order.
_THINK_FIELDS: dict[str, tuple[str, ...] | None] = {
    "no_think": None,  # no <think> block at all
    "free_think": (),  # <think> holds free text
    "grounding": ("observation", "reasoning"),
    "worldmodeling": ("reasoning", "prediction"),
    "grounding_worldmodeling": ("observation", "reasoning", "prediction"),
}


@dataclass(frozen=True)
class ParsedResponse:
    """The parser's verdict on one reply. ``error`` says why the format failed (None if correct)."""

    format_ok: bool
    think: str = ""
    observation: str = ""
    reasoning: str = ""
    prediction: str = ""
    answer: str = ""
    actions: tuple[str, ...] = ()
    error: str | None = None
    #: actions dropped because the reply had more than ``max_actions_per_turn``
    n_dropped_actions: int = 0


@dataclass(frozen=True)
class FormatExample:
    """Field contents an env supplies to show the model one complete, correct reply."""

    observation: str
    reasoning: str
    prediction: str
    answer: str
    think: str = ""


def check_format_name(fmt: str) -> None:
    if fmt not in FORMATS:
        import difflib

        close = difflib.get_close_matches(fmt, FORMATS, n=1)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        raise ValueError(f"Unknown reasoning format '{fmt}'.{hint} Valid formats: {', '.join(FORMATS)}.")


def _find_all(text: str, needle: str) -> list[int]:
    out, i = [], text.find(needle)
    while i != -1:
        out.append(i)
        i = text.find(needle, i + len(needle))
    return out


def _block(text: str, tag: str) -> tuple[int, int, str] | str:
    """(start, end, content) of the only ``<tag>...</tag>`` in ``text``, or an error string."""
    opens, closes = _find_all(text, f"<{tag}>"), _find_all(text, f"</{tag}>")
    if not opens and not closes:
        return f"missing <{tag}>...</{tag}>"
    if len(opens) != 1 or len(closes) != 1:
        return f"<{tag}> must appear exactly once (found {len(opens)} <{tag}> and {len(closes)} </{tag}>)"
    o, c = opens[0], closes[0]
    if c < o:
        return f"</{tag}> comes before <{tag}>"
    return o, c + len(tag) + 3, text[o + len(tag) + 2 : c]


def _best_effort_fields(text: str) -> dict[str, str]:
    """First ``<tag>...</tag>`` content of each field, for logging a malformed reply."""
    out = {}
    for tag in FIELDS:
        o = text.find(f"<{tag}>")
        c = text.find(f"</{tag}>", o + 1) if o != -1 else -1
        if o != -1 and c != -1:
            out[tag] = text[o + len(tag) + 2 : c].strip()
    return out


def split_actions(answer: str, action_sep: str, max_actions: int) -> tuple[tuple[str, ...], int]:
    """Split an answer into stripped non-empty actions, capped at ``max_actions``."""
    parts = [p.strip() for p in answer.split(action_sep)] if action_sep else [answer.strip()]
    parts = [p for p in parts if p]
    return tuple(parts[:max_actions]), max(0, len(parts) - max_actions)


def _check_only_whitespace(pieces: list[str], where: str) -> str | None:
    for p in pieces:
        if p.strip():
            snippet = p.strip()[:40]
            return f"text outside the tags {where}: {snippet!r}"
    return None


def _parse_strict(text: str, fmt: str) -> dict[str, str] | str:
    think_fields = _THINK_FIELDS[fmt]
    required = (("think",) if think_fields is not None else ()) + (think_fields or ()) + ("answer",)
    for tag in FIELDS:
        if tag not in required and (f"<{tag}>" in text or f"</{tag}>" in text):
            return f"tag <{tag}> is not part of the '{fmt}' format"
    for tag in required:  # exactly once in the whole reply, not just inside its parent block
        n_open, n_close = text.count(f"<{tag}>"), text.count(f"</{tag}>")
        if n_open > 1 or n_close > 1:
            return f"<{tag}> must appear exactly once (found {n_open} <{tag}> and {n_close} </{tag}>)"
    ans = _block(text, "answer")
    if isinstance(ans, str):
        return ans
    a0, a1, answer = ans
    fields = {"answer": answer.strip()}
    if think_fields is None:
        err = _check_only_whitespace([text[:a0], text[a1:]], "around <answer>")
        return err if err else fields
    th = _block(text, "think")
    if isinstance(th, str):
        return th
    t0, t1, think = th
    if t1 > a0:
        return "<think>...</think> must come before <answer>...</answer>"
    err = _check_only_whitespace([text[:t0], text[t1:a0], text[a1:]], "around <think> and <answer>")
    if err:
        return err
    fields["think"] = think.strip()
    pos, inner_pieces = 0, []
    for tag in think_fields:
        blk = _block(think, tag)
        if isinstance(blk, str):
            return blk
        b0, b1, content = blk
        if b0 < pos:
            return f"<{tag}> is out of order: expected {' -> '.join(think_fields)}"
        inner_pieces.append(think[pos:b0])
        pos = b1
        fields[tag] = content.strip()
    if think_fields:
        inner_pieces.append(think[pos:])
        err = _check_only_whitespace(inner_pieces, "inside <think>")
        if err:
            return err
    for tag in required:
        if not fields.get(tag):
            return f"<{tag}> is empty"
    return fields


def parse_response(text: object, fmt: str, action_sep: str = ",", max_actions: int = 3) -> ParsedResponse:
    """Parse a model reply for reasoning format ``fmt``. Never raises on any input text.

    ``fmt`` must be a known format (a programming error otherwise: ValueError).
    """
    check_format_name(fmt)
    if not isinstance(text, str):
        if isinstance(text, (bytes, bytearray)):
            text = bytes(text).decode("utf-8", errors="replace")
        else:
            return ParsedResponse(False, error=f"reply is not text (got {type(text).__name__})")
    result = _parse_strict(text, fmt)
    if isinstance(result, str):
        loose = _best_effort_fields(text)
        return ParsedResponse(False, error=result, **loose)
    actions, dropped = split_actions(result["answer"], action_sep, max_actions)
    if not actions:
        return ParsedResponse(False, error="<answer> holds no action", **result)
    return ParsedResponse(True, actions=actions, n_dropped_actions=dropped, **result)


def format_reward(parsed: ParsedResponse, n_valid_actions: int, amount: float) -> float:
    """The format bonus: ``amount`` when the format is correct and at least one valid action ran."""
    return float(amount) if parsed.format_ok and n_valid_actions >= 1 else 0.0


_STYLE_TEXT = {
    "natural": "Describe states in natural language: where each relevant object is relative to you.",
    "structured": (
        'Describe states as a JSON-like object mapping each object to its position relative to you, '
        'e.g. {"box": ["above", "left"]}.'
    ),
    "symbolic": "Describe states symbolically as the grid itself, one row per line, using the legend.",
}


def _template(fmt: str) -> str:
    think_fields = _THINK_FIELDS[fmt]
    if think_fields is None:
        return "<answer>...</answer>"
    if not think_fields:
        return "<think>...</think><answer>...</answer>"
    inner = "".join(f"<{t}>...</{t}>" for t in think_fields)
    return f"<think>{inner}</think><answer>...</answer>"


_MEANING = {
    "observation": "<observation> describes the current state you see",
    "reasoning": "<reasoning> explains your plan",
    "prediction": "<prediction> describes the state you expect after your actions",
}


def render_response(fmt: str, fields: FormatExample | dict) -> str:
    """Write a reply in format ``fmt`` from field contents (used for examples and demonstrations)."""
    check_format_name(fmt)
    get = (lambda k: getattr(fields, k)) if isinstance(fields, FormatExample) else (lambda k: fields.get(k, ""))
    think_fields = _THINK_FIELDS[fmt]
    answer = f"<answer>{get('answer')}</answer>"
    if think_fields is None:
        return answer
    if not think_fields:
        return f"<think>{get('think') or get('reasoning')}</think>{answer}"
    inner = "".join(f"<{t}>{get(t)}</{t}>" for t in think_fields)
    return f"<think>{inner}</think>{answer}"


def format_instruction(fmt: str, example: FormatExample, description_style: str = "natural",
                       action_sep: str = ",", max_actions: int = 3, *, style_text: str | None = None) -> str:
    """The system-prompt part that explains the format, with one example reply.

    ``style_text``: the env's own sentence on how to write state descriptions (e.g. coordinates
    for manipulation); None = the generic sentence of ``description_style``.
    """
    check_format_name(fmt)
    if description_style not in DESCRIPTION_STYLES:
        raise ValueError(f"Unknown description_style '{description_style}'; valid: {', '.join(DESCRIPTION_STYLES)}.")
    lines = [format_reminder(fmt, description_style, action_sep, max_actions, style_text=style_text)]
    lines.append("Example reply:")
    lines.append(render_response(fmt, example))
    return "\n".join(lines)


def format_reminder(fmt: str, description_style: str = "natural", action_sep: str = ",", max_actions: int = 3,
                    *, style_text: str | None = None) -> str:
    """The per-turn reminder of the format (no example), repeated with every observation.

    ``style_text`` replaces the generic description-style sentence (see ``format_instruction``).
    """
    check_format_name(fmt)
    parts = [f"Answer in the format: {_template(fmt)}"]
    think_fields = _THINK_FIELDS[fmt] or ()
    parts += [_MEANING[t] for t in think_fields]
    if any(t in think_fields for t in ("observation", "prediction")):
        parts.append(style_text if style_text is not None else _STYLE_TEXT[description_style])
    parts.append(
        f"<answer> holds up to {max_actions} action(s) separated by '{action_sep}'."
    )
    return " ".join(p if p.endswith(".") else p + "." for p in parts)



__all__ = [
    "FORMATS", "DESCRIPTION_STYLES", "FIELDS", "ParsedResponse", "FormatExample", "parse_response",
    "format_reward", "render_response", "format_instruction", "format_reminder", "split_actions",
    "check_format_name",
]
