"""PrimitiveSkill's reply parser: a reply -> skill calls (pure; never raises).

``pick(x, y, z)``, ``place(x, y, z)`` and ``push(x1, y1, z1, x2, y2, z2)`` in mm, separated by
``|``, case-insensitive names; parsing stops at the first action that is not a skill call.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

from vagent.envs.formats import ParsedResponse, parse_response
from vagent.envs.primitive_skill.sim import SKILL_ARITY, Skill

ACTIONS = ("pick", "place", "push")
ACTION_SEP = "|"
_CALL = re.compile(r"^\s*([A-Za-z_]+)\s*\((.*)\)\s*$", re.S)
_NUMBER = re.compile(r"^[-+]?(?:\d+(?:\.\d*)?|\.\d+)$")
_USAGE = "expected pick(x, y, z), place(x, y, z) or push(x1, y1, z1, x2, y2, z2) with numbers in mm"


def parse_skill(text: str) -> Skill | str:
    """One action string -> a :class:`Skill`, or a message saying why it is not one."""
    shown = text.strip()[:40]
    m = _CALL.match(text)
    if m is None:
        return f"'{shown}' is not a skill call ({_USAGE})"
    name, body = m.group(1).lower(), m.group(2)
    if name not in SKILL_ARITY:
        close = difflib.get_close_matches(name, ACTIONS, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        return f"unknown skill '{name[:20]}'{hint}; {_USAGE}"
    parts = [p.strip() for p in body.split(",")]
    if len(parts) != SKILL_ARITY[name]:
        return f"{name} takes {SKILL_ARITY[name]} coordinates, got {len(parts) if body.strip() else 0} in '{shown}'"
    for p in parts:
        if not _NUMBER.match(p):
            return f"'{p[:20]}' in '{shown}' is not a number"
    return Skill(name, tuple(float(p) for p in parts))


@dataclass(frozen=True)
class ParsedSkills:
    """A reply mapped to skills: ``skills`` up to the first action that is not a skill
    (``invalid``, with ``invalid_reason``); a failed format gives no skills."""

    parsed: ParsedResponse
    skills: tuple[Skill, ...]
    invalid: str | None = None
    invalid_reason: str | None = None

    @property
    def all_valid(self) -> bool:
        return self.parsed.format_ok and self.invalid is None


def parse_primitive_response(text: object, fmt: str, max_actions: int = 2) -> ParsedSkills:
    """The pure reply -> skills mapping of PrimitiveSkill (actions separated by ``|``). Never raises."""
    parsed = parse_response(text, fmt, action_sep=ACTION_SEP, max_actions=max_actions)
    skills: list[Skill] = []
    for raw in parsed.actions:
        skill = parse_skill(raw)
        if isinstance(skill, str):
            return ParsedSkills(parsed, tuple(skills), raw, skill)
        skills.append(skill)
    return ParsedSkills(parsed, tuple(skills))


__all__ = ["ACTIONS", "ACTION_SEP", "parse_skill", "ParsedSkills", "parse_primitive_response"]
