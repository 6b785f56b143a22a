"""FrozenLake: walk across a frozen lake from the start to the goal without falling into a hole.

Action format:
    The reply's ``<answer>`` holds up to ``max_actions_per_turn`` (default 5) of ``Left``,
    ``Down``, ``Right``, ``Up`` separated by ``,`` (case-insensitive). They run in order; the
    first unknown action stops execution and marks the turn invalid. Moving into the edge leaves
    the player in place. With ``is_slippery`` the player moves in the intended direction with
    probability 1/3 and in each of the two perpendicular directions with probability 1/3 (as
    gymnasium's FrozenLake-v1), drawn from the episode's own RNG.

Observation:
    ``render="vision"``: text with one ``<image>`` and an ``image_size`` x ``image_size`` RGB
    image (ice light blue, holes dark blue discs, goal gold, player red). ``render="text"``: the
    grid, one row per line, with the legend ``P`` player, ``_`` ice, ``O`` hole, ``G`` goal,
    ``X`` player in a hole, ``*`` player on the goal. After the first turn a feedback line about
    the last reply comes first; the format reminder comes last.

Rewards:
    ``success`` when the player reaches the goal, plus ``format`` (formats.format_reward: correct
    format and at least one valid action), plus the optional shaping term ``progress`` times the
    decrease of the BFS distance to the goal over the turn (:func:`progress_steps`). Presets: lite
    ``success=1.0, format=0.02, progress=0``; paper (legacy VAGEN) ``success=10, format=0.5,
    progress=0``. ``reward_<term>`` fields override the preset.

Episode end:
    terminated on reaching the goal (``success``) or falling into a hole; truncated after
    ``max_steps`` turns (``step`` calls, whatever they executed).

Arguments:
    see :class:`FrozenLakeConfig` (``vagent envs`` lists them): ``size``, ``p``, ``is_slippery``,
    ``max_steps``, ``fixed_map``, ``image_size``, the reward fields and the shared EnvConfig fields.

Version:
    v1. Differs from gymnasium's FrozenLake-v1 in: random start and goal (not fixed corners),
    maps regenerated from the seed until a BFS path exists, no hole-less guarantee beyond that,
    multi-action turns. Info keys: see docs/envs.md.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
from PIL import Image

from vagent.config import ConfigError
from vagent.envs.base import JudgeSpec, Observation, StepResult
from vagent.envs.formats import FormatExample, format_reward
from vagent.envs.grid import (
    MOVES, Cell, EpisodeClock, ParsedActions, bfs_actions, check_cells_fit, check_common_config, describe_relations,
    feedback_line, fill, inset, observation, parse_actions, prompt_tail, relations, reminder_for, render_tiles,
    resolve_rewards, step_info,
)
from vagent.envs.limits import Items
from vagent.envs.registry import EnvConfig

ACTIONS = ("Left", "Down", "Right", "Up")
REWARD_PRESETS = {
    "lite": {"success": 1.0, "format": 0.02, "progress": 0.0},
    "paper": {"success": 10.0, "format": 0.5, "progress": 0.0},
}
LEGEND = "P player, _ ice, O hole, G goal, X player in a hole, * player on the goal"


@dataclass
class FrozenLakeConfig(EnvConfig):
    """FrozenLake options (the shared EnvConfig fields come first)."""

    #: the most actions executed from one reply (FrozenLake's default is 5; extra ones are dropped)
    max_actions_per_turn: int = 5
    #: side of the square map in cells
    size: int = 4
    #: probability that a cell is ice (not a hole) when the map is drawn
    p: float = 0.8
    #: slippery ice: the intended move happens with prob 1/3, each perpendicular move with 1/3
    is_slippery: bool = False
    #: turns (step calls) before the episode is truncated
    max_steps: int = 20
    #: a fixed map, one string per row (P start, G goal, O hole, _ ice); empty = drawn from the seed
    fixed_map: tuple[str, ...] = ()
    #: side of the rendered image in pixels (render="vision")
    image_size: int = 96
    #: reward for reaching the goal; None = from the `rewards` preset (lite 1.0, paper 10)
    reward_success: float | None = None
    #: format bonus per turn (correct format and >= 1 valid action); None = preset (lite 0.02, paper 0.5)
    reward_format: float | None = None
    #: shaping per turn: this times the decrease of the BFS distance to the goal over the turn
    #: (negative when it grows; falling into a hole counts as one step away); None = preset (0 in
    #: both presets, as in VAGEN). Success rates do not depend on it.
    reward_progress: float | None = None


# ---------------------------------------------------------------------------------------------
# Pure game logic
# ---------------------------------------------------------------------------------------------

def shortest_path(size: int, holes: frozenset[Cell], start: Cell, goal: Cell) -> list[str] | None:
    """BFS shortest action sequence from ``start`` to ``goal`` avoiding holes (None if none).

    Neighbours are tried in the fixed order Left, Down, Right, Up so the plan is deterministic.
    """
    if start == goal:
        return []

    def moves(cell: Cell) -> list[tuple[str, Cell]]:
        return [(name, nxt) for name in ACTIONS if (nxt := move(size, cell, name)) not in holes]

    return bfs_actions(start, moves, lambda cell: cell == goal)


def goal_distance(size: int, holes: frozenset[Cell], cell: Cell, goal: Cell) -> int | None:
    """Shortest-path length (in moves, avoiding holes) from ``cell`` to ``goal``; None if none."""
    path = shortest_path(size, holes, cell, goal)
    return None if path is None else len(path)


def progress_steps(size: int, holes: frozenset[Cell], goal: Cell, before: Cell, after: Cell) -> int:
    """How many moves closer to the goal a turn took the player (BFS distance avoiding holes):
    positive toward the goal, negative away, 0 when unchanged. Ending in a hole counts as one move
    away from where the turn started; a start with no path (in a hole) counts 0."""
    d0 = goal_distance(size, holes, before, goal)
    if d0 is None:
        return 0
    if after in holes:
        return -1
    d1 = goal_distance(size, holes, after, goal)
    return 0 if d1 is None else d0 - d1


def move(size: int, cell: Cell, action: str) -> Cell:
    """The cell after moving ``action`` (canonical name) from ``cell``; the edge blocks."""
    dr, dc = MOVES[action.lower()]
    r, c = cell[0] + dr, cell[1] + dc
    return (r, c) if 0 <= r < size and 0 <= c < size else cell


def slip(action: str, rng: np.random.Generator) -> str:
    """The direction actually taken on slippery ice: intended or either perpendicular, 1/3 each."""
    i = ACTIONS.index(action)
    return ACTIONS[(i + int(rng.integers(3)) - 1) % 4]


def generate_map(rng: np.random.Generator, size: int, p: float) -> tuple[frozenset[Cell], Cell, Cell]:
    """(holes, start, goal): each cell is ice with prob ``p``; start and goal are distinct random
    ice cells; redrawn (same RNG stream) until a BFS path from start to goal exists."""
    for _ in range(10_000):
        ice = rng.random((size, size)) < p
        cells = [(int(r), int(c)) for r, c in zip(*np.nonzero(ice))]
        if len(cells) < 2:
            continue
        i, j = rng.choice(len(cells), size=2, replace=False)
        start, goal = cells[int(i)], cells[int(j)]
        holes = frozenset((int(r), int(c)) for r, c in zip(*np.nonzero(~ice)))
        if shortest_path(size, holes, start, goal) is not None:
            return holes, start, goal
    raise ConfigError(f"FrozenLake: no solvable {size}x{size} map with p={p} in 10000 draws; raise `p`.")


def grid_rows(size: int, holes: frozenset[Cell], goal: Cell, player: Cell) -> list[str]:
    """The symbol grid (see LEGEND)."""
    rows = []
    for r in range(size):
        row = []
        for c in range(size):
            cell = (r, c)
            if cell == player:
                row.append("X" if cell in holes else "*" if cell == goal else "P")
            else:
                row.append("O" if cell in holes else "G" if cell == goal else "_")
        rows.append("".join(row))
    return rows


def make_state(size: int, holes: frozenset[Cell], goal: Cell, player: Cell) -> dict[str, Any]:
    """The JSON-able ground-truth state (what ``FrozenLakeEnv.state()`` returns)."""
    hole_list = sorted(holes)
    return {
        "grid": grid_rows(size, holes, goal, player),
        "player": list(player),
        "goal": list(goal),
        "holes": [list(h) for h in hole_list],
        "relations": relations(player, [("goal", goal)] + [("hole", h) for h in hole_list]),
    }


def state_from_grid(rows: Sequence[str]) -> dict[str, Any]:
    """Build a state from a symbol grid (tests, examples): one of P/X/* and one of G/*."""
    size = len(rows)
    holes, goal, player = set(), None, None
    for r, row in enumerate(rows):
        if len(row) != size:
            raise ValueError(f"FrozenLake grid must be square; row {r} is {row!r}")
        for c, s in enumerate(row):
            if s in "OX":
                holes.add((r, c))
            if s in "G*":
                goal = (r, c)
            if s in "PX*":
                player = (r, c)
    if goal is None or player is None:
        raise ValueError(f"grid needs a goal and a player: {list(rows)}")
    return make_state(size, frozenset(holes), goal, player)


def parse_fixed_map(rows: Sequence[str]) -> tuple[frozenset[Cell], Cell, Cell]:
    """(holes, start, goal) of a ``fixed_map`` (P start, G goal, O hole, _ ice); ConfigError if bad."""
    where = "frozenlake.fixed_map"
    size = len(rows)
    if size < 2 or any(len(r) != size for r in rows) or any(ch not in "PGO_" for r in rows for ch in r):
        raise ConfigError(f"{where}: expected a square of at least 2 rows of the symbols P, G, O, _; got {list(rows)}.")
    cells = {ch: [(r, c) for r, row in enumerate(rows) for c, s in enumerate(row) if s == ch] for ch in "PGO"}
    if len(cells["P"]) != 1 or len(cells["G"]) != 1:
        raise ConfigError(f"{where}: expected exactly one P (start) and one G (goal); got {list(rows)}.")
    holes, start, goal = frozenset(cells["O"]), cells["P"][0], cells["G"][0]
    if shortest_path(size, holes, start, goal) is None:
        raise ConfigError(f"{where}: no path from P to G avoids the holes; got {list(rows)}.")
    return holes, start, goal


def describe_state(state: Mapping[str, Any], style: str) -> str:
    """A correct description of ``state`` in ``style`` (natural / structured / symbolic)."""
    return describe_relations(state, style, ("goal", "hole"))


def parse_frozenlake_response(text: object, fmt: str, max_actions: int = 5) -> ParsedActions:
    """The pure reply -> actions mapping of FrozenLake (canonical names Left/Down/Right/Up)."""
    return parse_actions(text, fmt, ACTIONS, max_actions, ",")


# ---------------------------------------------------------------------------------------------
# Rendering
# ---------------------------------------------------------------------------------------------

_ICE, _HOLE, _GOAL, _PLAYER = (200, 230, 250), (20, 40, 90), (240, 190, 30), (220, 40, 40)
_T_ICE = (fill(_ICE), inset("rect", _ICE, 0.0, outline=(235, 245, 255)))
_T_HOLE = _T_ICE + (inset("ellipse", _HOLE, 0.12),)
_T_GOAL = _T_ICE + (inset("rect", _GOAL, 0.2, outline=(150, 110, 0), width=2),)
_T_PLAYER = (inset("ellipse", _PLAYER, 0.2, outline=(120, 0, 0)),)
TILES = {
    "_": _T_ICE, "O": _T_HOLE, "G": _T_GOAL, "P": _T_ICE + _T_PLAYER,
    "X": _T_HOLE + (inset("cross", _PLAYER, 0.2, width=3),), "*": _T_GOAL + _T_PLAYER,
}


def render_image(rows: Sequence[str], image_size: int) -> Image.Image:
    return render_tiles(rows, TILES, image_size, background=(120, 140, 160))


# ---------------------------------------------------------------------------------------------
# The env
# ---------------------------------------------------------------------------------------------

_EXAMPLE_BEFORE = ("P_O", "_O_", "__G")
_EXAMPLE_ACTIONS = ("Down", "Down", "Right", "Right")


class FrozenLakeEnv:
    """FrozenLake with reasoning formats, image or text observations, and a BFS solver."""

    Config = FrozenLakeConfig
    judge_spec = JudgeSpec(
        object_weights={"goal": 0.7, "hole": 0.3},
        synonyms={"goal": ("goal", "gift", "present", "destination", "target", "flag"),
                  "hole": ("hole", "holes", "pit", "trap", "water")},
    )
    action_names = ACTIONS
    action_sep = ","
    #: upper bounds checked by make() and the env server (vagent/envs/limits.py; docs/envs.md)
    config_bounds = {"size": (2, 32), "image_size": (8, 1024), "fixed_map": Items(32, 32)}

    def __init__(self, config: FrozenLakeConfig | None = None) -> None:
        cfg = config if config is not None else FrozenLakeConfig()
        check_common_config(cfg, "frozenlake")
        if cfg.size < 2:
            raise ConfigError(f"frozenlake.size: expected >= 2, got {cfg.size}.")
        if not 0.0 < cfg.p <= 1.0:
            raise ConfigError(f"frozenlake.p: the ice probability must be in (0, 1], got {cfg.p}.")
        self._fixed = parse_fixed_map(cfg.fixed_map) if cfg.fixed_map else None
        if self._fixed is not None:
            cfg = dataclasses.replace(cfg, size=len(cfg.fixed_map))
        check_cells_fit(cfg, "frozenlake", cfg.size, "fixed_map" if self._fixed is not None else "size")
        self.config = cfg
        self.rewards = resolve_rewards(cfg, REWARD_PRESETS, "frozenlake")
        self._clock = EpisodeClock("frozenlake", cfg.max_steps)
        self._reminder = reminder_for(cfg)
        self._rng: np.random.Generator | None = None
        self._holes: frozenset[Cell] = frozenset()
        self._goal: Cell = (0, 0)
        self._player: Cell = (0, 0)

    # -- contract ---------------------------------------------------------------------------
    def reset(self, seed: int) -> tuple[Observation, dict]:
        self._rng = np.random.default_rng(seed)
        if self._fixed is not None:
            self._holes, self._player, self._goal = self._fixed
        else:
            self._holes, self._player, self._goal = generate_map(self._rng, self.config.size, self.config.p)
        self._clock.reset()
        return self._observation(""), {"success": False}

    def step(self, response: str) -> StepResult:
        self._clock.tick()
        cfg = self.config
        pa = parse_frozenlake_response(response, cfg.format, cfg.max_actions_per_turn)
        executed, start, fell, won = [], self._player, False, False
        for action in pa.actions:
            taken = slip(action, self._rng) if cfg.is_slippery else action
            self._player = move(cfg.size, self._player, taken)
            executed.append(action)
            fell, won = self._player in self._holes, self._player == self._goal
            if fell or won:
                break
        reward = (self.rewards["success"] if won else 0.0) + format_reward(pa.parsed, len(executed), self.rewards["format"])
        if self.rewards["progress"]:
            reward += self.rewards["progress"] * progress_steps(cfg.size, self._holes, self._goal, start, self._player)
        terminated = fell or won
        truncated = self._clock.finish(terminated)
        effect = ("You reached the goal!" if won else "You fell into a hole." if fell
                  else "You moved." if self._player != start else "You did not move.")
        info = step_info(pa, executed, self._player != start, won, fell_in_hole=fell)
        return StepResult(self._observation(feedback_line(pa, executed, effect)), float(reward), terminated, truncated, info)

    def system_prompt(self) -> str:
        cfg = self.config
        lines = [
            "You are playing FrozenLake. Walk across the frozen lake to the goal without falling into a hole.",
            f"Actions: {', '.join(ACTIONS)} (one cell each; walking into the edge leaves you in place).",
        ]
        if cfg.is_slippery:
            lines.append("The ice is slippery: you move in the intended direction only 1/3 of the time; "
                         "otherwise you slide to one of the two perpendicular directions.")
        lines.append(f"The episode ends when you reach the goal, fall into a hole, or after {cfg.max_steps} turns.")
        image = ("Each observation is an image of the lake: light blue cells are ice, dark blue discs are holes, "
                 "the gold square is the goal, the red disc is you.")
        return "\n".join(lines + prompt_tail(cfg, image, LEGEND, self._example()))

    def state(self) -> dict:
        self._clock.require_started()
        return make_state(self.config.size, self._holes, self._goal, self._player)

    def close(self) -> None:
        self._rng = None
        self._clock.close()

    def optimal_actions(self) -> list[str]:
        """BFS shortest path from the player to the goal in the deterministic (non-slippery)
        graph; [] when the episode is over or no path exists (player in a hole)."""
        self._clock.require_started()
        if self._player in self._holes:
            return []
        return shortest_path(self.config.size, self._holes, self._player, self._goal) or []

    # -- helpers ----------------------------------------------------------------------------
    def _observation(self, feedback: str) -> Observation:
        rows = grid_rows(self.config.size, self._holes, self._goal, self._player)
        return observation(self.config.render, rows, lambda: render_image(rows, self.config.image_size),
                           feedback, self._reminder)

    def _example(self) -> FormatExample:
        before = state_from_grid(_EXAMPLE_BEFORE)
        size, holes, goal = 3, frozenset(tuple(h) for h in before["holes"]), tuple(before["goal"])
        actions = _EXAMPLE_ACTIONS[: self.config.max_actions_per_turn]
        player = tuple(before["player"])
        for a in actions:
            player = move(size, player, a)
        after = make_state(size, holes, goal, player)
        style = self.config.description_style
        return FormatExample(
            observation=describe_state(before, style),
            reasoning="The goal is below and to the right of me and holes block the right side, "
                      "so I go down along the left edge first, then right.",
            prediction=describe_state(after, style),
            answer=",".join(actions),
        )
