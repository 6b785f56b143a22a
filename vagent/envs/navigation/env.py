"""Navigation: walk through a furnished room to the object named in the instruction (VAGEN's Navigation).

Action format:
    The reply's ``<answer>`` holds up to ``max_actions_per_turn`` (default 5) of ``moveahead``,
    ``moveback``, ``moveright``, ``moveleft`` (one ``grid_size`` step, default 0.25 m, without
    turning), ``rotateright``, ``rotateleft`` (90 degrees in place), ``lookup``, ``lookdown``
    (tilt the camera 30 degrees, between 30 up and 60 down) separated by ``|``
    (case-insensitive). They run in order; the first unknown action stops execution and marks the
    turn invalid. A move into a wall or furniture, or a look past the camera limit, leaves the
    agent in place (the action still counts).

Observation:
    ``render="vision"``: the human instruction (``Navigate to the red sofa.``) and one
    ``<image>``: the agent's egocentric ``image_size`` x ``image_size`` camera view rendered by
    :mod:`vagent.envs.navigation.raycast` (furniture as coloured boxes, walls tinted by the
    compass direction they are seen in, tiled floor). ``render="text"``: the instruction and a
    text view: the free distance straight ahead and every object in the image with its direction
    and distance. With ``target_hint`` a line gives the target's true direction and distance.
    After the first turn a feedback line about the last reply comes first; the format reminder
    comes last.

Rewards:
    ``success`` when the agent gets within ``success_distance`` (1 m) of the target's footprint
    (and, with ``require_facing``, has its centre in view), plus ``format``
    (formats.format_reward: correct format and at least one valid action). Presets: lite
    ``success=1.0, format=0.01``; paper (legacy VAGEN) ``success=10, format=0.5``.
    ``reward_<term>`` fields override the preset.

Episode end:
    terminated on success (actions after the successful one are not run); truncated after
    ``max_steps`` turns (``step`` calls, whatever they executed).

Arguments:
    see :class:`NavigationConfig` (``vagent envs navigation`` lists them): ``backend``,
    ``max_steps``, ``image_size``, ``fov``, ``grid_size``, ``room_size``, ``num_objects``,
    ``partition_prob``, ``success_distance``, ``require_facing``, ``min_start_distance``,
    ``target_hint``, ``ai2thor_scenes``, the reward fields and the shared EnvConfig fields.

Version:
    v1. Differs from VAGEN's AI2-THOR env: procedurally generated rooms and our own numpy
    raycaster (``backend="raycast"``, the default; AI2-THOR downloads a Unity build at run time
    and needs a display or GPU, see ``ai2thor_backend.py``), moves of 0.25 m on a grid (VAGEN:
    0.3-0.4 m), distance to the target's footprint rather than its centre, pitch rendered as a
    vertical shear. Info keys and the state format: docs/envs_navigation.md.
"""

from __future__ import annotations
import difflib
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Mapping

from vagent.config import ConfigError
from vagent.envs.base import IMAGE_PLACEHOLDER, JudgeSpec, Observation, StepResult
from vagent.envs.formats import FormatExample, format_instruction, format_reminder, format_reward
from vagent.envs.grid import (
    EpisodeClock, ParsedActions, check_common_config, feedback_line, parse_actions, resolve_rewards, step_info,
)
from vagent.envs.navigation.describe import describe_state, object_label, relation_phrase, view_text
from vagent.envs.navigation.raycast import RaycastWorld
from vagent.envs.navigation.world import ACTIONS, CATALOG, LEGEND, GenerationError, NavBackend, RoomParams, parse_layout
from vagent.envs.registry import EnvConfig

REWARD_PRESETS = {
    "lite": {"success": 1.0, "format": 0.01},
    "paper": {"success": 10.0, "format": 0.5},
}
BACKENDS = ("raycast", "ai2thor")
ACTION_SEP = "|"
__all__ = ["ACTIONS", "LEGEND", "REWARD_PRESETS", "NavigationConfig", "NavigationEnv", "describe_state",
           "parse_navigation_response", "relation_phrase"]


@dataclass
class NavigationConfig(EnvConfig):
    """Navigation options (the shared EnvConfig fields come first)."""

    #: the most actions executed from one reply (VAGEN navigation: 5; extra ones are dropped)
    max_actions_per_turn: int = 5
    #: world: "raycast" (procedural rooms, numpy renderer) or "ai2thor" (needs ai2thor, a display/GPU and
    #: a Unity download; untested here)
    backend: str = "raycast"
    #: turns (step calls) before the episode is truncated
    max_steps: int = 20
    #: side of the square egocentric image in pixels (also sets which objects count as visible)
    image_size: int = 96
    #: horizontal field of view of the camera in degrees (AI2-THOR's default is 90)
    fov: float = 90.0
    #: metres per move and per floor-grid cell (VAGEN moves 0.3-0.4 m)
    grid_size: float = 0.25
    #: (min, max) side length of a generated room in metres, drawn per axis
    room_size: tuple[float, float] = (3.0, 5.0)
    #: furniture objects per room: distinct types and colours, at most 12
    num_objects: int = 6
    #: probability that a room gets an interior partition wall with a 1 m doorway
    partition_prob: float = 0.5
    #: success when the agent is within this many metres of the target's footprint (VAGEN: 1.0)
    success_distance: float = 1.0
    #: success also needs the target's centre inside the horizontal field of view
    require_facing: bool = False
    #: the start cell is at least this many metres from the target's footprint (> success_distance)
    min_start_distance: float = 1.5
    #: add the target's true direction and distance to every observation (an easier task)
    target_hint: bool = False
    #: backend="ai2thor" only: scenes drawn from by seed; empty = living rooms FloorPlan201-230
    ai2thor_scenes: tuple[str, ...] = ()
    #: reward for reaching the target; None = from the `rewards` preset (lite 1.0, paper 10)
    reward_success: float | None = None
    #: format bonus per turn (correct format and >= 1 valid action); None = preset (lite 0.01, paper 0.5)
    reward_format: float | None = None


def check_config(cfg: NavigationConfig) -> None:
    """Validate the navigation fields; raise ConfigError naming the field and the fix."""
    where = "navigation"
    check_common_config(cfg, where)
    if cfg.backend not in BACKENDS:
        close = difflib.get_close_matches(str(cfg.backend), BACKENDS, n=1)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        raise ConfigError(f"{where}.backend: unknown backend {cfg.backend!r}.{hint} Valid: {', '.join(BACKENDS)}.")
    if cfg.image_size < 16:
        raise ConfigError(f"{where}.image_size: expected >= 16 pixels, got {cfg.image_size}.")
    if not 20.0 <= cfg.fov <= 150.0:
        raise ConfigError(f"{where}.fov: expected a field of view in [20, 150] degrees, got {cfg.fov}.")
    if not 0.05 <= cfg.grid_size <= 1.0:
        raise ConfigError(f"{where}.grid_size: expected metres in [0.05, 1.0], got {cfg.grid_size}.")
    lo, hi = cfg.room_size
    if not 2.0 <= lo <= hi <= 30.0:
        raise ConfigError(f"{where}.room_size: expected (min, max) metres with 2 <= min <= max <= 30, "
                          f"got {cfg.room_size}.")
    if not 1 <= cfg.num_objects <= len(CATALOG):
        raise ConfigError(f"{where}.num_objects: expected 1..{len(CATALOG)} (one per furniture type), "
                          f"got {cfg.num_objects}.")
    if not 0.0 <= cfg.partition_prob <= 1.0:
        raise ConfigError(f"{where}.partition_prob: expected a probability in [0, 1], got {cfg.partition_prob}.")
    if cfg.success_distance <= 0:
        raise ConfigError(f"{where}.success_distance: expected > 0 metres, got {cfg.success_distance}.")
    if cfg.min_start_distance <= cfg.success_distance:
        raise ConfigError(f"{where}.min_start_distance: must exceed success_distance ({cfg.success_distance}) so an "
                          f"episode does not start solved; got {cfg.min_start_distance}.")
    if cfg.backend == "ai2thor" and cfg.description_style == "symbolic":
        raise ConfigError(f"{where}.description_style: 'symbolic' needs the room map of backend='raycast'; "
                          "use natural or structured with backend='ai2thor'.")


def parse_navigation_response(text: object, fmt: str, max_actions: int = 5) -> ParsedActions:
    """The pure reply -> actions mapping (canonical lower-case names, separator ``|``)."""
    return parse_actions(text, fmt, ACTIONS, max_actions, ACTION_SEP)


# The descriptions (describe_state, view_text, relation_phrase) are in describe.py: the judges,
# the solver and the demos find describe_state here, in the env's module.

# ---------------------------------------------------------------------------------------------
# The env
# ---------------------------------------------------------------------------------------------

_EXAMPLE_LAYOUT = (
    "##############",
    "#............#",
    "#.SSSSSS.....#",
    "#.SSSSSS.....#",
    "#............#",
    "#............#",
    "#.........L..#",
    "#............#",
    "#............#",
    "#............#",
    "#............#",
    "#............#",
    "#..........^.#",
    "#............#",
    "##############",
)
_EXAMPLE_OBJECTS = {"S": ("sofa", "red"), "L": ("lamp", "green")}
_EXAMPLE_ACTIONS = ("moveahead", "moveahead", "moveleft", "moveahead", "moveleft")


@lru_cache(maxsize=16)
def _example(style: str, max_actions: int, fov: float) -> FormatExample:
    """A worked example from a fixed room, its descriptions from ``describe_state`` (so correct)."""
    room, pose = parse_layout(_EXAMPLE_LAYOUT, _EXAMPLE_OBJECTS)
    world = RaycastWorld(RoomParams(fov=fov), image_size=96)
    target = next(k for k, o in enumerate(room.objects) if o.name == "sofa")
    world.set_scene(room, target, pose)
    before = describe_state(world.observe(), style)
    actions = _EXAMPLE_ACTIONS[:max_actions]
    for a in actions:
        world.apply(a)
    return FormatExample(
        observation=before,
        reasoning="The red sofa is ahead of me and to the left, so I walk ahead and step left towards it.",
        prediction=describe_state(world.observe(), style),
        answer=ACTION_SEP.join(actions),
    )


class NavigationEnv:
    """Embodied navigation with reasoning formats, an egocentric camera (or text view) and a BFS solver."""

    Config = NavigationConfig
    judge_spec = JudgeSpec(
        object_weights={t.name: 1.0 / len(CATALOG) for t in CATALOG},
        synonyms={t.name: (t.name,) + t.synonyms for t in CATALOG},
        vertical_words=("ahead", "behind", "same"),
        horizontal_words=("left", "right", "same"),
    )
    action_names = ACTIONS
    action_sep = ACTION_SEP
    #: upper bounds checked by make() and the env server (vagent/envs/limits.py; docs/envs.md)
    config_bounds = {"image_size": (16, 512)}
    #: only the operator of an env server sets these (the simulator process and its scenes)
    server_only = ("backend", "ai2thor_scenes")

    def __init__(self, config: NavigationConfig | None = None) -> None:
        cfg = config if config is not None else NavigationConfig()
        check_config(cfg)
        self.config = cfg
        self.rewards = resolve_rewards(cfg, REWARD_PRESETS, "navigation")
        self._clock = EpisodeClock("navigation", cfg.max_steps)
        self._reminder = format_reminder(cfg.format, cfg.description_style, ACTION_SEP, cfg.max_actions_per_turn)
        self._world: NavBackend = self._make_backend(cfg)
        self._instruction = ""

    @staticmethod
    def _make_backend(cfg: NavigationConfig) -> NavBackend:
        params = RoomParams(cell=cfg.grid_size, room_size=tuple(cfg.room_size), num_objects=cfg.num_objects,
                            partition_prob=cfg.partition_prob, min_start_distance=cfg.min_start_distance,
                            success_distance=cfg.success_distance, require_facing=cfg.require_facing, fov=cfg.fov)
        if cfg.backend == "ai2thor":
            from vagent.envs.navigation.ai2thor_backend import Ai2ThorWorld

            return Ai2ThorWorld(params, image_size=cfg.image_size, scenes=tuple(cfg.ai2thor_scenes))
        return RaycastWorld(params, image_size=cfg.image_size)

    # -- contract ---------------------------------------------------------------------------
    def reset(self, seed: int) -> tuple[Observation, dict]:
        try:
            self._world.reset(seed)
        except GenerationError as exc:
            raise ConfigError(f"navigation (seed {seed}): {exc}") from exc
        self._clock.reset()
        state = self._world.observe()
        self._instruction = state["instruction"]
        return self._observation("", state), {"success": False, "distance_to_target": self._world.target_distance()}

    def step(self, response: str) -> StepResult:
        self._clock.tick()
        cfg = self.config
        pa = parse_navigation_response(response, cfg.format, cfg.max_actions_per_turn)
        executed, blocked, changed, success = [], 0, False, False
        for action in pa.actions:
            moved = self._world.apply(action)
            executed.append(action)
            changed |= moved
            blocked += not moved
            if self._world.success():
                success = True
                break
        reward = (self.rewards["success"] if success else 0.0)
        reward += format_reward(pa.parsed, len(executed), self.rewards["format"])
        truncated = self._clock.finish(success)
        state = self._world.observe()
        if success:
            effect = f"You reached the {object_label(state['target'])}!"
        elif blocked:
            effect = f"{blocked} action(s) had no effect (blocked by an obstacle, or the camera limit)."
        else:
            effect = "You moved." if changed else ""
        info = step_info(pa, executed, changed, success, n_blocked_actions=blocked,
                         distance_to_target=self._world.target_distance())
        obs = self._observation(feedback_line(pa, executed, effect), state)
        return StepResult(obs, float(reward), bool(success), bool(truncated), info)

    def system_prompt(self) -> str:
        cfg = self.config
        step = f"{cfg.grid_size:g} m"
        lines = [
            "You are a home robot and perform navigation tasks according to instructions.",
            f"Actions: moveahead, moveback, moveright, moveleft (move {step} forward, backward, right or left "
            "without turning), rotateright, rotateleft (turn 90 degrees in place), lookup, lookdown (tilt the "
            "camera 30 degrees; from 30 up to 60 down). Walls and furniture block moves.",
            f"You succeed when you are within {cfg.success_distance:g} m of the target object"
            + (" and it is in your field of view" if cfg.require_facing else "")
            + f". The episode ends on success or after {cfg.max_steps} turns.",
        ]
        if cfg.render == "vision":
            lines.append(f"Each observation is an image from your own camera ({cfg.fov:g} degree field of view, "
                         "1.5 m above the floor). Furniture appears as coloured boxes; walls are tinted by the "
                         "direction you look at them (north blue-grey, east sand, south sage green, west rose); "
                         "the floor has 0.5 m wooden tiles.")
        else:
            lines.append("Each observation describes your view: the free distance straight ahead and each object "
                         "you can see, with its direction and distance.")
        lines.append("Hints: you can take several actions a turn, e.g. move ahead several times when the target is "
                     "far away; if you cannot see the target, rotate to look around; describe where objects are "
                     "relative to you with ahead/behind and left/right, and their distance in metres.")
        if cfg.description_style == "symbolic":
            lines.append(f"Map legend (the whole room from above, turned so that you face up): {LEGEND}.")
        example = _example(cfg.description_style, cfg.max_actions_per_turn, float(cfg.fov))
        lines.append(format_instruction(cfg.format, example, cfg.description_style, ACTION_SEP,
                                        cfg.max_actions_per_turn))
        return "\n".join(lines)

    def state(self) -> dict:
        """Ground truth for the judges (JSON-able): ``instruction``; ``agent`` {x, z, yaw, pitch,
        facing}; ``target`` {object, color, direction, vertical, horizontal, distance, bearing,
        visible}; ``visible_objects`` (up to 5 in the image, nearest first, same fields +
        ``is_target``); ``obstacle_ahead`` (metres); ``relations`` (target, then the visible
        non-target objects: {object, vertical, horizontal}); ``success``; ``map`` (raycast only:
        the egocentric room map in LEGEND symbols)."""
        self._clock.require_started()
        return self._world.observe()

    def close(self) -> None:
        self._world.close()
        self._clock.close()

    def optimal_actions(self) -> list[str]:
        """BFS shortest action sequence over (cell, yaw) to a success pose; [] when already there
        or unreachable. Raycast backend only (EnvError otherwise)."""
        self._clock.require_started()
        return self._world.plan() or []

    # -- helpers ----------------------------------------------------------------------------
    def _observation(self, feedback: str, state: Mapping[str, Any]) -> Observation:
        cfg = self.config
        parts = [feedback] if feedback else []
        parts.append(f"Human instruction: {state['instruction'].capitalize()}.")
        if cfg.render == "vision":
            parts.append(f"Current observation: {IMAGE_PLACEHOLDER}")
            images = (self._world.frame(),)
        else:
            parts.append("Current observation:\n" + view_text(state))
            images = ()
        if cfg.target_hint:
            t = state["target"]
            parts.append(f"Hint: the {object_label(t)} is {relation_phrase(t['vertical'], t['horizontal'])}, "
                         f"{float(t['distance']):.1f} m away.")
        parts.append(self._reminder)
        return Observation("\n".join(parts), images)
