"""Shared pieces of the grid envs (Sokoban, FrozenLake): small functions, used by composition.

- relation words of an object relative to the player (the rule judge's vocabulary);
- reward presets resolved against explicit config fields;
- the pure reply -> actions mapping (``formats.parse_response`` + a case-insensitive name lookup,
  stopping at the first unknown action);
- tile-based PIL rendering with per-size tile caches (``vagent.envs.tiles``, re-exported here);
- the observation text (feedback line + observation + format reminder) and the step ``info``;
- :class:`EpisodeClock`, the reset/step/end bookkeeping that raises the contract's errors;
- :func:`bfs_actions`, the fewest actions between states (the planners of FrozenLake, Sokoban's
  walks and Navigation).

Coordinates are ``(row, col)`` with row 0 at the top: "above" means a smaller row.
"""

from __future__ import annotations

import difflib
import json
from collections import deque
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Callable, Hashable, Iterable, Mapping, Sequence, TypeVar

from PIL import Image

from vagent.config import ConfigError
from vagent.envs.base import IMAGE_PLACEHOLDER, EnvError, EpisodeOverError, Observation
from vagent.envs.formats import DESCRIPTION_STYLES, FORMATS, FormatExample, ParsedResponse, format_instruction, \
    format_reminder, parse_response
from vagent.envs.tiles import TileDrawer, _tile, fill, inset, render_tiles  # noqa: F401 - re-exported

if TYPE_CHECKING:
    from vagent.envs.registry import EnvConfig

Cell = tuple[int, int]
State = TypeVar("State", bound=Hashable)
Action = TypeVar("Action")

#: (d_row, d_col) of each move name.
MOVES: dict[str, Cell] = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}

RENDERS = ("vision", "text")


# ---------------------------------------------------------------------------------------------
# Relations
# ---------------------------------------------------------------------------------------------

def relation_words(player: Sequence[int], obj: Sequence[int]) -> tuple[str, str]:
    """(vertical, horizontal) of ``obj`` seen from ``player``: above/below/same, left/right/same."""
    (pr, pc), (r, c) = player, obj
    vertical = "above" if r < pr else "below" if r > pr else "same"
    horizontal = "left" if c < pc else "right" if c > pc else "same"
    return vertical, horizontal


def relations(player: Sequence[int], objects: Iterable[tuple[str, Sequence[int]]]) -> list[dict[str, str]]:
    """``[{"object", "vertical", "horizontal"}]`` for each ``(type, cell)`` in ``objects``."""
    out = []
    for kind, cell in objects:
        v, h = relation_words(player, cell)
        out.append({"object": kind, "vertical": v, "horizontal": h})
    return out


def relation_phrase(vertical: str, horizontal: str, of: str = "you", same_place: str = "") -> str:
    """Natural-language position relative to ``of``, always naming both axes with the judge's words.

    ("above", "left") -> "above and to the left of you"; ("same", "right") ->
    "to the right of you, in the same row"; ("below", "same") -> "below you, in the same column";
    ("same", "same") -> ``same_place``, by default "in the same row and the same column as you".
    """
    if vertical == "same" and horizontal == "same":
        return same_place or f"in the same row and the same column as {of}"
    if vertical == "same":
        return f"to the {horizontal} of {of}, in the same row"
    if horizontal == "same":
        return f"{vertical} {of}, in the same column"
    return f"{vertical} and to the {horizontal} of {of}"


def describe_relations(state: Mapping[str, Any], style: str, kinds: Sequence[str]) -> str:
    """Describe ``state["relations"]`` of the object types ``kinds`` in ``style``.

    natural: one sentence per object ("The box is above and to the left of you.");
    structured: JSON mapping each type to ``[vertical, horizontal]`` (one object) or a list of such
    pairs (several), e.g. ``{"goal": ["below", "right"], "hole": [["above", "left"], ["same", "right"]]}``;
    symbolic: the grid rows, one per line.
    """
    if style not in DESCRIPTION_STYLES:
        raise ValueError(f"Unknown description style '{style}'; valid: {', '.join(DESCRIPTION_STYLES)}.")
    if style == "symbolic":
        return "\n".join(state["grid"])
    by_kind: dict[str, list[tuple[str, str]]] = {k: [] for k in kinds}
    for rel in state["relations"]:
        if rel["object"] in by_kind:
            by_kind[rel["object"]].append((rel["vertical"], rel["horizontal"]))
    if style == "structured":
        obj: dict[str, list] = {}
        for kind, pairs in by_kind.items():
            if len(pairs) == 1:
                obj[kind] = list(pairs[0])
            elif pairs:
                obj[kind] = [list(p) for p in pairs]
        return json.dumps(obj)
    sentences = []
    for kind, pairs in by_kind.items():
        if len(pairs) == 1:
            sentences.append(f"The {kind} is {relation_phrase(*pairs[0])}.")
        else:
            for i, pair in enumerate(pairs, 1):
                sentences.append(f"{kind.capitalize()} {i} is {relation_phrase(*pair)}.")
    return " ".join(sentences) if sentences else "There is nothing to report."


# ---------------------------------------------------------------------------------------------
# Config checks and reward presets
# ---------------------------------------------------------------------------------------------

def check_common_config(cfg: Any, where: str) -> None:
    """Validate the shared EnvConfig fields; raise ConfigError naming the fix."""
    if cfg.format not in FORMATS:
        close = difflib.get_close_matches(str(cfg.format), FORMATS, n=1)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        raise ConfigError(f"{where}.format: unknown reasoning format {cfg.format!r}.{hint} Valid: {', '.join(FORMATS)}.")
    if cfg.description_style not in DESCRIPTION_STYLES:
        raise ConfigError(
            f"{where}.description_style: expected one of {', '.join(DESCRIPTION_STYLES)}, got {cfg.description_style!r}."
        )
    if cfg.render not in RENDERS:
        raise ConfigError(f"{where}.render: expected 'vision' or 'text', got {cfg.render!r}.")
    if cfg.max_actions_per_turn < 1:
        raise ConfigError(f"{where}.max_actions_per_turn: expected >= 1, got {cfg.max_actions_per_turn}.")
    if getattr(cfg, "max_steps", 1) < 1:
        raise ConfigError(f"{where}.max_steps: expected >= 1 turn, got {cfg.max_steps}.")
    if getattr(cfg, "image_size", 16) < 8:
        raise ConfigError(f"{where}.image_size: expected >= 8 pixels, got {cfg.image_size}.")


#: the smallest tile (pixels) a grid image can draw: smaller cells cannot hold the tile's inset shapes
MIN_CELL_PX = 3


def check_cells_fit(cfg: Any, where: str, cells: int, field: str) -> None:
    """With ``render="vision"``, ``cells`` grid cells per side must get >= MIN_CELL_PX pixels each
    of ``cfg.image_size``; raise ConfigError naming both fields and the fix otherwise."""
    if cfg.render == "vision" and cfg.image_size // max(1, cells) < MIN_CELL_PX:
        raise ConfigError(f"{where}.{field}: {cells} cells per side do not fit image_size={cfg.image_size} "
                          f"(each cell needs >= {MIN_CELL_PX} pixels): use image_size >= {MIN_CELL_PX * cells}, "
                          f"a smaller {field}, or render='text'.")


def resolve_rewards(cfg: EnvConfig, presets: Mapping[str, Mapping[str, float]], where: str) -> dict[str, float]:
    """Reward terms: the preset ``cfg.rewards`` overridden by every ``reward_<term>`` field not None.

    ``presets`` maps preset name -> {term: value}; the config declares ``reward_<term>: float | None``
    for each term (None = take the preset's value).
    """
    if cfg.rewards not in presets:
        close = difflib.get_close_matches(str(cfg.rewards), list(presets), n=1)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        raise ConfigError(f"{where}.rewards: unknown preset {cfg.rewards!r}.{hint} Valid presets: {', '.join(presets)}.")
    terms = dict(presets[cfg.rewards])
    names = {f.name for f in fields(cfg)}
    for term in terms:
        field_name = f"reward_{term}"
        if field_name not in names:  # a programming error in the env, not the user's
            raise TypeError(f"{type(cfg).__name__} lacks the field '{field_name}' for reward term '{term}'")
        value = getattr(cfg, field_name)
        if value is not None:
            terms[term] = float(value)
    return terms


# ---------------------------------------------------------------------------------------------
# Reply -> actions
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ParsedActions:
    """A reply mapped to env actions.

    ``actions``: the canonical names of the valid actions, in order, up to the first unknown one;
    ``unknown``: the first action that is not a valid name (execution stops there), else None.
    """

    parsed: ParsedResponse
    actions: tuple[str, ...]
    unknown: str | None = None

    @property
    def all_valid(self) -> bool:
        """The format is correct and every action of the answer is a known name."""
        return self.parsed.format_ok and self.unknown is None


def parse_actions(text: object, fmt: str, action_names: Sequence[str], max_actions: int,
                  action_sep: str = ",") -> ParsedActions:
    """Parse a reply and map its actions to canonical ``action_names`` (case-insensitive).

    Pure and never raises on any reply. Actions past the first unknown one are not returned.
    """
    parsed = parse_response(text, fmt, action_sep=action_sep, max_actions=max_actions)
    lookup = {name.lower(): name for name in action_names}
    actions: list[str] = []
    for raw in parsed.actions:
        name = lookup.get(raw.strip().lower())
        if name is None:
            return ParsedActions(parsed, tuple(actions), unknown=raw)
        actions.append(name)
    return ParsedActions(parsed, tuple(actions))


# ---------------------------------------------------------------------------------------------
# Observations, info, episode bookkeeping
# ---------------------------------------------------------------------------------------------

def observation(render: str, grid: Sequence[str], image_fn: Callable[[], Image.Image], feedback: str,
                reminder: str) -> Observation:
    """Feedback line (turns > 0) + the observation (image placeholder or text grid) + the reminder."""
    parts = [feedback] if feedback else []
    if render == "vision":
        parts.append(f"Current observation: {IMAGE_PLACEHOLDER}")
        images: tuple[Image.Image, ...] = (image_fn(),)
    else:
        parts.append("Current observation:\n" + "\n".join(grid))
        images = ()
    parts.append(reminder)
    return Observation("\n".join(parts), images)


def prompt_tail(cfg: EnvConfig, image_line: str, legend: str, example: FormatExample) -> list[str]:
    """The last lines of a grid env's system prompt: what its image shows (``render: vision``), the
    grid legend (a text render or symbolic descriptions) and the format instruction (actions
    separated by ',')."""
    lines = []
    if cfg.render == "vision":
        lines.append(image_line)
    if cfg.render == "text" or cfg.description_style == "symbolic":
        lines.append(f"Grid legend, one row per line: {legend}.")
    lines.append(format_instruction(cfg.format, example, cfg.description_style, ",", cfg.max_actions_per_turn))
    return lines


def reminder_for(cfg: EnvConfig) -> str:
    """The per-turn format reminder of a grid env config (actions separated by ',')."""
    return format_reminder(cfg.format, cfg.description_style, ",", cfg.max_actions_per_turn)


def feedback_line(pa: ParsedActions, executed: Sequence[str], effect: str) -> str:
    """One short line about what the last reply did (shown at the top of the next observation)."""
    if not pa.parsed.format_ok:
        return f"Last reply: format error ({pa.parsed.error}); no action was executed."
    done = ", ".join(executed) if executed else "nothing"
    line = f"Last reply: executed {done}."
    if pa.unknown is not None:
        line += f" '{pa.unknown[:30]}' is not a valid action; execution stopped there."
    return f"{line} {effect}".strip()


def step_info(pa: ParsedActions, executed: Sequence[str], effective: bool, success: bool,
              **extra: object) -> dict[str, Any]:
    """The documented info keys every grid env returns (``docs/envs.md``)."""
    info: dict[str, Any] = {
        "action_is_valid": pa.all_valid,
        "action_is_effective": bool(effective),
        "n_valid_actions": len(executed),
        "format_ok": pa.parsed.format_ok,
        "format_error": pa.parsed.error,
        "success": bool(success),
        "executed_actions": list(executed),
    }
    info.update(extra)
    return info


class EpisodeClock:
    """Counts turns and raises the contract's errors: step before reset, step after the end."""

    def __init__(self, env_name: str, max_steps: int) -> None:
        self.env_name, self.max_steps = env_name, max_steps
        self.started = False
        self.over = False
        self.turn = 0

    def reset(self) -> None:
        self.started, self.over, self.turn = True, False, 0

    def tick(self) -> None:
        """Call at the start of ``step``: raises if stepping is not allowed, then counts the turn."""
        if not self.started:
            raise EnvError(f"{self.env_name}: step() called before reset(); call reset(seed) first.")
        if self.over:
            raise EpisodeOverError(
                f"{self.env_name}: step() called after the episode ended (terminated or truncated); "
                "call reset(seed) to start a new episode."
            )
        self.turn += 1

    def finish(self, terminated: bool, truncated: bool = False) -> bool:
        """Record the end of a step; return ``truncated``: not terminated, and the turn limit was
        reached or the caller's own limit (``truncated``) hit."""
        truncated = not terminated and (truncated or self.turn >= self.max_steps)
        self.over = terminated or truncated
        return truncated

    def close(self) -> None:
        """After ``close`` the env needs a new ``reset`` before ``step``/``state``."""
        self.started, self.over = False, False

    def require_started(self) -> None:
        if not self.started:
            raise EnvError(f"{self.env_name}: call reset(seed) before using the episode state.")


def bfs_actions(start: State, moves: Callable[[State], Iterable[tuple[Action, State]]],
                is_goal: Callable[[State], bool]) -> list[Action] | None:
    """The fewest actions from ``start`` to a state where ``is_goal`` holds, by breadth-first search;
    None if no such state is reachable. ``moves(state)`` gives the ``(action, next state)`` pairs
    allowed from ``state`` in a fixed order, so the plan is deterministic (the first found among the
    shortest). ``start`` itself is not tested: a caller returns [] when it is already a goal."""
    prev: dict[State, tuple[State, Action]] = {}  # a reached state -> (the state before, the action)
    queue = deque([start])
    while queue:
        state = queue.popleft()
        for action, nxt in moves(state):
            if nxt == start or nxt in prev:
                continue
            prev[nxt] = (state, action)
            if is_goal(nxt):
                path = []
                while nxt != start:
                    nxt, step = prev[nxt]
                    path.append(step)
                return path[::-1]
            queue.append(nxt)
    return None
