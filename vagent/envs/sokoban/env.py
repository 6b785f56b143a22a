"""Sokoban: push every box onto a target.

Action format:
    The reply's ``<answer>`` holds up to ``max_actions_per_turn`` (default 3) of ``Up``,
    ``Down``, ``Left``, ``Right`` separated by ``,`` (case-insensitive). They run in order; the
    first unknown action stops execution and marks the turn invalid. Walking into a wall, or
    pushing a box into a wall or another box, leaves everything in place (the action still counts).

Observation:
    ``render="vision"``: text with one ``<image>`` and an ``image_size`` x ``image_size`` RGB
    image (walls brown brick, floor beige, targets red rings, boxes orange, boxes on targets
    green, the player blue). ``render="text"``: the grid, one row per line, legend ``#`` wall,
    ``_`` floor, ``O`` target, ``X`` box, ``*`` box on target, ``P`` player, ``S`` player on
    target. After the first turn a feedback line about the last reply comes first; the format
    reminder comes last.

Rewards:
    per executed action ``step``; per push of a box onto a target ``box_on_target``, off a target
    ``box_off_target``; ``success`` when every box is on a target; plus ``format``
    (formats.format_reward: correct format and at least one valid action). Presets: lite
    ``success=1.0, format=0.1`` (others 0); paper (legacy VAGEN / gym-sokoban) ``step=-0.1,
    box_on_target=1, box_off_target=-1, success=10, format=0.5``. ``reward_<term>`` fields override.

Episode end:
    terminated when every box is on a target (``success``); truncated after ``max_steps`` turns
    (``step`` calls, whatever they executed). A deadlocked level is not terminated.

Arguments:
    see :class:`SokobanConfig` (``vagent envs`` lists them): ``dim_room``, ``num_boxes``,
    ``min_solution_length``, ``max_solution_length``, ``max_steps``, ``fixed_level``,
    ``image_size``, ``solver_max_nodes``, the reward fields and the shared EnvConfig fields.

Version:
    v1. Own generator (vagent.envs.sokoban.generator: random topology + reverse play + A*), not
    gym-sokoban's; every level is verified solvable with an optimal solution length in
    [min_solution_length, max_solution_length]. Info keys: see docs/envs.md.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
from PIL import Image

from vagent.config import ConfigError
from vagent.envs.base import EnvError, JudgeSpec, Observation, StepResult
from vagent.envs.formats import FormatExample, format_reward
from vagent.envs.grid import (
    EpisodeClock, ParsedActions, check_cells_fit, check_common_config, describe_relations, feedback_line, fill, inset, observation,
    parse_actions, prompt_tail, relations, reminder_for, render_tiles, resolve_rewards, step_info,
)
from vagent.envs.limits import Items
from vagent.envs.registry import EnvConfig
from vagent.envs.sokoban.generator import GenerationError, generate_level
from vagent.envs.sokoban.solver import MOVE_NAMES, Board, SolverLimitError, solve

ACTIONS = MOVE_NAMES  # ("Up", "Down", "Left", "Right")
REWARD_PRESETS = {
    "lite": {"step": 0.0, "box_on_target": 0.0, "box_off_target": 0.0, "success": 1.0, "format": 0.1},
    "paper": {"step": -0.1, "box_on_target": 1.0, "box_off_target": -1.0, "success": 10.0, "format": 0.5},
}
LEGEND = "# wall, _ floor, O target, X box, * box on target, P player, S player on target"


@dataclass
class SokobanConfig(EnvConfig):
    """Sokoban options (the shared EnvConfig fields come first)."""

    #: room size (rows, cols) including the outer wall ring
    dim_room: tuple[int, int] = (6, 6)
    #: number of boxes (and targets)
    num_boxes: int = 1
    #: the fewest moves an optimal solution of a generated level may take
    min_solution_length: int = 4
    #: the most moves an optimal solution of a generated level may take (also the reverse-play length)
    max_solution_length: int = 30
    #: turns (step calls) before the episode is truncated
    max_steps: int = 30
    #: a fixed level, one string per row in the text legend (# _ O X * P S); empty = generated from the seed
    fixed_level: tuple[str, ...] = ()
    #: side of the rendered image in pixels (render="vision")
    image_size: int = 96
    #: push states the solver may expand in optimal_actions() before raising EnvError
    solver_max_nodes: int = 200_000
    #: reward per executed action; None = from the `rewards` preset (lite 0, paper -0.1)
    reward_step: float | None = None
    #: reward per box pushed onto a target; None = preset (lite 0, paper 1)
    reward_box_on_target: float | None = None
    #: reward per box pushed off a target; None = preset (lite 0, paper -1)
    reward_box_off_target: float | None = None
    #: reward when every box is on a target; None = preset (lite 1, paper 10)
    reward_success: float | None = None
    #: format bonus per turn (correct format and >= 1 valid action); None = preset (lite 0.1, paper 0.5)
    reward_format: float | None = None


# ---------------------------------------------------------------------------------------------
# Pure game logic on (board, player, boxes)
# ---------------------------------------------------------------------------------------------

def push(board: Board, player: int, boxes: frozenset[int], action: str) -> tuple[int, frozenset[int], int | None]:
    """One move: (new player, new boxes, the box's new cell if a box was pushed, else None)."""
    d = board.deltas[ACTIONS.index(action)]
    q = player + d
    if not board.floor[q]:
        return player, boxes, None
    if q in boxes:
        dst = q + d
        if not board.floor[dst] or dst in boxes:
            return player, boxes, None
        return q, (boxes - {q}) | {dst}, dst
    return q, boxes, None


def grid_rows(board: Board, player: int, boxes: frozenset[int]) -> list[str]:
    """The symbol grid (see LEGEND)."""
    rows = []
    for r in range(board.height):
        row = []
        for c in range(board.width):
            i = r * board.width + c
            target = i in board.targets
            if not board.floor[i]:
                row.append("#")
            elif i == player:
                row.append("S" if target else "P")
            elif i in boxes:
                row.append("*" if target else "X")
            else:
                row.append("O" if target else "_")
        rows.append("".join(row))
    return rows


def make_state(board: Board, player: int, boxes: frozenset[int]) -> dict[str, Any]:
    """The JSON-able ground-truth state (what ``SokobanEnv.state()`` returns)."""
    p = list(board.cell(player))
    box_cells = [list(board.cell(b)) for b in sorted(boxes)]
    target_cells = [list(board.cell(t)) for t in sorted(board.targets)]
    return {
        "grid": grid_rows(board, player, boxes),
        "player": p,
        "boxes": box_cells,
        "targets": target_cells,
        "boxes_on_target": len(boxes & board.targets),
        "relations": relations(p, [("box", b) for b in box_cells] + [("target", t) for t in target_cells]),
    }


def parse_level(rows: Sequence[str]) -> tuple[Board, int, frozenset[int]]:
    """(board, player, boxes) of a level in the text legend; ValueError says what is wrong."""
    height = len(rows)
    width = len(rows[0]) if rows else 0
    if height < 3 or any(len(r) != width for r in rows) or width < 3:
        raise ValueError(f"expected at least 3 rows of equal length >= 3, got {list(rows)}")
    bad = sorted({ch for r in rows for ch in r} - set("#_OX*PS"))
    if bad:
        raise ValueError(f"unknown symbols {bad}; the legend is {LEGEND}")
    flat = "".join(rows)
    if any(flat[i] != "#" for i in range(len(flat)) if i // width in (0, height - 1) or i % width in (0, width - 1)):
        raise ValueError(f"the outer ring must be walls '#': {list(rows)}")
    players = [i for i, s in enumerate(flat) if s in "PS"]
    boxes = frozenset(i for i, s in enumerate(flat) if s in "X*")
    targets = frozenset(i for i, s in enumerate(flat) if s in "O*S")
    if len(players) != 1:
        raise ValueError(f"expected exactly one player (P or S), found {len(players)}")
    if not boxes or len(boxes) != len(targets):
        raise ValueError(f"expected as many boxes as targets (>= 1), found {len(boxes)} and {len(targets)}")
    floor = bytes(0 if s == "#" else 1 for s in flat)
    return Board(height, width, floor, targets), players[0], boxes


def state_from_grid(rows: Sequence[str]) -> dict[str, Any]:
    """The state of a level given in the text legend (tests, examples)."""
    return make_state(*parse_level(rows))


def describe_state(state: Mapping[str, Any], style: str) -> str:
    """A correct description of ``state`` in ``style`` (natural / structured / symbolic)."""
    return describe_relations(state, style, ("box", "target"))


def parse_sokoban_response(text: object, fmt: str, max_actions: int = 3) -> ParsedActions:
    """The pure reply -> actions mapping of Sokoban (canonical names Up/Down/Left/Right)."""
    return parse_actions(text, fmt, ACTIONS, max_actions, ",")


# ---------------------------------------------------------------------------------------------
# Rendering
# ---------------------------------------------------------------------------------------------

_FLOOR, _WALL, _TARGET = (225, 220, 200), (110, 62, 40), (210, 50, 50)
_BOX, _BOX_ON, _PLAYER = (230, 150, 40), (70, 170, 70), (40, 90, 220)
_T_FLOOR = (fill(_FLOOR),)
_T_WALL = (fill(_WALL), inset("rect", _WALL, 0.0, outline=(70, 35, 20)), inset("cross", (90, 50, 30), 0.3))
_T_TARGET = _T_FLOOR + (inset("ring", _TARGET, 0.2, width=2),)
_T_PLAYER = (inset("ellipse", _PLAYER, 0.18, outline=(20, 40, 120)),)
TILES = {
    "#": _T_WALL, "_": _T_FLOOR, "O": _T_TARGET,
    "X": _T_FLOOR + (inset("rect", _BOX, 0.1, outline=(130, 80, 20), width=2),),
    "*": _T_FLOOR + (inset("rect", _BOX_ON, 0.1, outline=(30, 100, 30), width=2),),
    "P": _T_FLOOR + _T_PLAYER, "S": _T_TARGET + _T_PLAYER,
}


def render_image(rows: Sequence[str], image_size: int) -> Image.Image:
    return render_tiles(rows, TILES, image_size, background=_WALL)


def _check_generation_config(cfg: SokobanConfig) -> None:
    h, w = cfg.dim_room
    if h < 4 or w < 4:
        raise ConfigError(f"sokoban.dim_room: expected at least (4, 4) including the wall ring, got {cfg.dim_room}.")
    if not 1 <= cfg.num_boxes <= (h - 2) * (w - 2) // 3:
        raise ConfigError(f"sokoban.num_boxes: expected 1..{(h - 2) * (w - 2) // 3} for dim_room {cfg.dim_room}, "
                          f"got {cfg.num_boxes}.")
    if not 1 <= cfg.min_solution_length <= cfg.max_solution_length:
        raise ConfigError("sokoban: expected 1 <= min_solution_length <= max_solution_length, got "
                          f"{cfg.min_solution_length} and {cfg.max_solution_length}.")


# ---------------------------------------------------------------------------------------------
# The env
# ---------------------------------------------------------------------------------------------

_EXAMPLE_BEFORE = ("######", "#P___#", "#_X__#", "#_O__#", "######")
_EXAMPLE_ACTIONS = ("Right", "Down")


class SokobanEnv:
    """Sokoban with reasoning formats, image or text observations, and an optimal A* solver."""

    Config = SokobanConfig
    judge_spec = JudgeSpec(
        object_weights={"box": 0.5, "target": 0.5},
        synonyms={"box": ("box", "boxes", "crate", "crates"),
                  "target": ("target", "targets", "goal", "goals", "spot", "dock")},
    )
    action_names = ACTIONS
    action_sep = ","
    #: upper bounds checked by make() and the env server (vagent/envs/limits.py; docs/envs.md): level
    #: generation costs up to 2000 reverse-play attempts, each growing with the room, boxes and lengths
    config_bounds = {"dim_room": (4, 24), "num_boxes": (1, 6), "min_solution_length": (1, 100),
                     "max_solution_length": (1, 100), "solver_max_nodes": (1, 500_000), "image_size": (8, 1024),
                     "fixed_level": Items(24, 24)}

    def __init__(self, config: SokobanConfig | None = None) -> None:
        cfg = config if config is not None else SokobanConfig()
        check_common_config(cfg, "sokoban")
        self._fixed = None
        if cfg.fixed_level:
            try:
                self._fixed = parse_level(cfg.fixed_level)
            except ValueError as exc:
                raise ConfigError(f"sokoban.fixed_level: {exc}.") from exc
            board, player, boxes = self._fixed
            try:
                solvable = solve(board, player, sorted(boxes), cfg.solver_max_nodes) is not None
            except SolverLimitError:
                solvable = True  # too big to prove either way; play it
            if not solvable:
                raise ConfigError(f"sokoban.fixed_level: the level has no solution: {list(cfg.fixed_level)}.")
            cfg = dataclasses.replace(cfg, dim_room=(board.height, board.width), num_boxes=len(boxes))
        else:
            _check_generation_config(cfg)
        check_cells_fit(cfg, "sokoban", max(cfg.dim_room), "fixed_level" if self._fixed is not None else "dim_room")
        self.config = cfg
        self.rewards = resolve_rewards(cfg, REWARD_PRESETS, "sokoban")
        self._clock = EpisodeClock("sokoban", cfg.max_steps)
        self._reminder = reminder_for(cfg)
        self._board: Board | None = None
        self._player = 0
        self._boxes: frozenset[int] = frozenset()
        self._plans: dict[tuple[int, frozenset[int]], list[str]] = {}

    # -- contract ---------------------------------------------------------------------------
    def reset(self, seed: int) -> tuple[Observation, dict]:
        cfg = self.config
        rng = np.random.default_rng(seed)
        self._plans = {}
        if self._fixed is not None:
            self._board, self._player, self._boxes = self._fixed
        else:
            try:
                level = generate_level(rng, cfg.dim_room[0], cfg.dim_room[1], cfg.num_boxes,
                                       cfg.min_solution_length, cfg.max_solution_length)
            except GenerationError as exc:
                raise ConfigError(f"sokoban (seed {seed}): {exc}") from exc
            self._board, self._player, self._boxes = level.board, level.player, frozenset(level.boxes)
            self._remember_plan(list(level.solution))
        self._clock.reset()
        return self._observation(""), {"success": False, "boxes_on_target": len(self._boxes & self._board.targets)}

    def step(self, response: str) -> StepResult:
        self._clock.tick()
        cfg, board, terms = self.config, self._board, self.rewards
        pa = parse_sokoban_response(response, cfg.format, cfg.max_actions_per_turn)
        start, executed, reward, success = (self._player, self._boxes), [], 0.0, False
        for action in pa.actions:
            was_on = len(self._boxes & board.targets)
            self._player, self._boxes, _ = push(board, self._player, self._boxes, action)
            executed.append(action)
            now_on = len(self._boxes & board.targets)
            reward += terms["step"]
            reward += terms["box_on_target"] * max(0, now_on - was_on) + terms["box_off_target"] * max(0, was_on - now_on)
            if self._boxes == board.targets:
                success = True
                reward += terms["success"]
                break
        reward += format_reward(pa.parsed, len(executed), terms["format"])
        truncated = self._clock.finish(success)
        moved = self._player != start[0]
        effect = ("Every box is on a target!" if success else "You pushed a box." if self._boxes != start[1]
                  else "You moved." if moved else "You did not move.")
        info = step_info(pa, executed, moved, success, boxes_on_target=len(self._boxes & board.targets))
        return StepResult(self._observation(feedback_line(pa, executed, effect)), float(reward), success, truncated, info)

    def system_prompt(self) -> str:
        cfg = self.config
        lines = [
            "You are playing Sokoban. Push every box onto a target. You can push a box by walking into it "
            "if the cell behind it is free; you cannot pull boxes or push two boxes at once.",
            f"Actions: {', '.join(ACTIONS)} (one cell each).",
            f"The episode ends when every box is on a target, or after {cfg.max_steps} turns.",
        ]
        image = ("Each observation is an image of the room: brown brick cells are walls, beige cells floor, red rings "
                 "targets, orange squares boxes, green squares boxes on targets, the blue disc is you.")
        return "\n".join(lines + prompt_tail(cfg, image, LEGEND, self._example()))

    def state(self) -> dict:
        self._clock.require_started()
        return make_state(self._board, self._player, self._boxes)

    def close(self) -> None:
        self._plans = {}
        self._clock.close()

    def optimal_actions(self) -> list[str]:
        """A fewest-moves plan from the current state (A*); [] when solved or deadlocked.

        Raises EnvError if the search exceeds ``solver_max_nodes`` push states.
        """
        self._clock.require_started()
        key = (self._player, self._boxes)
        if key not in self._plans:
            try:
                plan = solve(self._board, self._player, sorted(self._boxes), self.config.solver_max_nodes)
            except SolverLimitError as exc:
                raise EnvError(f"sokoban: {exc}; raise solver_max_nodes or use smaller levels.") from exc
            if plan is None:
                return []
            self._remember_plan(plan)
        return list(self._plans[key])

    # -- helpers ----------------------------------------------------------------------------
    def _remember_plan(self, plan: list[str]) -> None:
        """Cache the plan for the current state and every state along it."""
        player, boxes = self._player, self._boxes
        for i, action in enumerate(plan):
            self._plans[(player, boxes)] = plan[i:]
            player, boxes, _ = push(self._board, player, boxes, action)
        self._plans[(player, boxes)] = []

    def _observation(self, feedback: str) -> Observation:
        rows = grid_rows(self._board, self._player, self._boxes)
        return observation(self.config.render, rows, lambda: render_image(rows, self.config.image_size),
                           feedback, self._reminder)

    def _example(self) -> FormatExample:
        board, player, boxes = parse_level(_EXAMPLE_BEFORE)
        actions = _EXAMPLE_ACTIONS[: self.config.max_actions_per_turn]
        before = make_state(board, player, boxes)
        for a in actions:
            player, boxes, _ = push(board, player, boxes, a)
        style = self.config.description_style
        return FormatExample(
            observation=describe_state(before, style),
            reasoning="The box is below and to the right of me and the target is right below the box, "
                      "so I step right to stand above the box and push it down onto the target.",
            prediction=describe_state(make_state(board, player, boxes), style),
            answer=",".join(actions),
        )
