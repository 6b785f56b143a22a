"""The SVG env's reply parser: a reply in the env's format -> the SVG document of its answer.

Pure functions; :func:`parse_svg_response` never raises (see :mod:`vagent.envs.svg.env`).
"""

from __future__ import annotations

from dataclasses import dataclass

from vagent.envs.formats import ParsedResponse, parse_response


def extract_svg(answer: str) -> str | None:
    """The SVG document in an answer: from the first ``<svg`` to the last ``</svg>`` (or a
    self-closing ``<svg .../>``); None if there is none."""
    start = answer.find("<svg")
    if start == -1:
        return None
    end = answer.rfind("</svg>")
    if end > start:
        return answer[start:end + len("</svg>")]
    close = answer.find("/>", start)
    if close != -1 and answer.find(">", start) == close + 1:
        return answer[start:close + 2]
    return None


@dataclass(frozen=True)
class ParsedSVG:
    """A reply mapped to its SVG: ``svg`` (None if absent) and ``error`` (why there is none)."""

    parsed: ParsedResponse
    svg: str | None
    error: str | None


def parse_svg_response(text: object, fmt: str) -> ParsedSVG:
    """Parse a reply in format ``fmt`` and extract the SVG of its answer. Pure; never raises."""
    parsed = parse_response(text, fmt, action_sep="", max_actions=1)
    if not parsed.format_ok:
        return ParsedSVG(parsed, None, f"format error ({parsed.error})")
    svg = extract_svg(parsed.answer)
    if svg is None:
        return ParsedSVG(parsed, None, "the answer holds no <svg>...</svg> document")
    return ParsedSVG(parsed, svg, None)


__all__ = ["extract_svg", "ParsedSVG", "parse_svg_response"]
