"""PrimitiveSkill: a robot arm on a tabletop driven by primitive skills (VAGEN's PrimitiveSkill).

Action format:
    The reply's ``<answer>`` holds up to ``max_actions_per_turn`` (default 2) skills separated by
    ``|``: ``pick(x, y, z)``, ``place(x, y, z)``, ``push(x1, y1, z1, x2, y2, z2)`` with coordinates
    in millimetres (numbers, case-insensitive names). They run in order; the first action that is
    not a well-formed skill, or a skill that cannot run (out of reach, empty gripper, nothing to
    grasp, a collision, ...), stops execution and marks the turn invalid; the feedback line says
    why. Execution also stops once the task is solved. Skill semantics: ``sim.py``.

Observation:
    Text: the task instruction, every object's centre ``(x, y, z)`` in mm (as VAGEN gives them),
    targets, the drawer's opening and handle, the gripper and what it holds, and the workspace.
    ``render="vision"`` adds one ``<image>``: an ``image_size`` x ``image_size`` top-down view
    (``render.py``; the robot at the bottom, x up, y left, a 50 mm grid; on ManiSkill a camera above
    the table with the same framing); ``render="text"`` shows
    the same text without it. After the first turn a feedback line about the last reply comes
    first; the format reminder comes last.

Rewards:
    ``progress(after) - progress(before)`` where progress is ``success`` when solved, else
    ``stage * (1 + highest stage reached)`` (tasks.py), minus ``action_cost`` per executed skill,
    plus ``format`` (formats.format_reward: correct format and >= 1 executed skill). Summed over
    an episode the progress terms give VAGEN's ``compute_reward`` (final - initial - 0.1 per
    skill); VAGEN paid it once at the end, we pay each turn's share on that turn. Presets: paper
    (legacy VAGEN) ``stage=2, success=10, format=0.1, action_cost=0.1``; lite (our rescaling to a
    success of 1 like the other lite presets) ``stage=0.2, success=1, format=0.1, action_cost=0``.

Episode end:
    terminated on success; truncated after ``max_steps`` turns (``step`` calls). A failed skill
    never ends the episode (VAGEN's ``task_fail``, a cube leaving the workspace, cannot happen:
    such skills are rejected).

Arguments:
    see :class:`PrimitiveSkillConfig`: ``task`` (align, place, stack, drawer), ``backend``
    (kinematic or maniskill), ``drawer_close``, ``max_steps``, ``image_size``, the tolerances, the
    reward fields and the shared EnvConfig fields (``description_style`` defaults to structured,
    the paper's best for manipulation).

Version:
    v1. Our own deterministic kinematic simulator by default; ``backend="maniskill"`` runs the
    offline tasks on ManiSkill 3 (PhysX and a camera image on the CPU, ``maniskill.py``; setup:
    scripts/maniskill-env).
    Deviations from VAGEN: out-of-reach coordinates fail instead of being clipped; cumulative
    stage flags and a drawer that starts closed (tasks.py); rewards paid per turn. Info keys:
    docs/envs_primitive_skill.md.
"""

from __future__ import annotations

import difflib
from typing import Any, Protocol

import numpy as np
from PIL import Image

from vagent.config import ConfigError
from vagent.envs.base import IMAGE_PLACEHOLDER, JudgeSpec, Observation, StepResult
from vagent.envs.formats import format_reminder, format_reward
from vagent.envs.grid import EpisodeClock, check_common_config, resolve_rewards
from vagent.envs.primitive_skill.config import PrimitiveSkillConfig  # noqa: F401 - re-exported
from vagent.envs.primitive_skill.describe import describe_state, make_state
from vagent.envs.primitive_skill.prompts import STYLE_TEXT, feedback_line, scene_lines, system_prompt_text
from vagent.envs.primitive_skill.render import render_scene
from vagent.envs.primitive_skill.replies import (
    ACTION_SEP, ACTIONS, ParsedSkills, parse_primitive_response, parse_skill,
)
from vagent.envs.primitive_skill.sim import Bounds, Scene, Skill, SkillResult, Tolerances
from vagent.envs.primitive_skill.tasks import TASKS, Task, TaskParams, get_task, progress_value, stage_of

# the reply parser (replies.py), the ground truth and its descriptions (describe.py) are
# re-exported: vagent.rollout.scripted, vagent.recipes.demos and the judges look describe_state
# up in the env's module
__all__ = ["ACTIONS", "ACTION_SEP", "BACKENDS", "REWARD_PRESETS", "Backend", "KinematicBackend", "ParsedSkills",
           "PrimitiveSkillConfig", "PrimitiveSkillEnv", "describe_state", "make_state", "parse_primitive_response",
           "parse_skill"]

BACKENDS = ("kinematic", "maniskill")
REWARD_PRESETS = {
    "lite": {"stage": 0.2, "success": 1.0, "format": 0.1, "action_cost": 0.0},
    "paper": {"stage": 2.0, "success": 10.0, "format": 0.1, "action_cost": 0.1},
}


# ---------------------------------------------------------------------------------------------
# Backends
# ---------------------------------------------------------------------------------------------

class Backend(Protocol):
    """What the env needs from a simulator (kinematic here, ManiSkill in ``maniskill.py``)."""

    def reset(self, seed: int) -> None: ...

    def scene(self) -> Scene: ...

    def apply(self, skill: Skill) -> SkillResult: ...

    def render(self, size: int) -> Image.Image: ...

    def save(self) -> Any:
        """A snapshot of the simulation that :meth:`restore` puts back (for a prediction)."""
        ...

    def restore(self, saved: Any) -> None: ...

    def close(self) -> None: ...


class KinematicBackend:
    """Our simulator: the task's scene drawn from ``default_rng(seed)``; skills per ``sim.py``."""

    def __init__(self, task: Task, bounds: Bounds, tol: Tolerances):
        self.task, self.bounds, self.tol = task, bounds, tol
        self._scene: Scene | None = None

    def reset(self, seed: int) -> None:
        self._scene = self.task.build(np.random.default_rng(seed), self.bounds, self.tol)

    def scene(self) -> Scene:
        assert self._scene is not None, "reset first"
        return self._scene

    def apply(self, skill: Skill) -> SkillResult:
        return self.scene().apply(skill)

    def render(self, size: int) -> Image.Image:
        return render_scene(self.scene(), size)

    def save(self) -> Scene:
        return self.scene().copy()

    def restore(self, saved: Scene) -> None:
        self._scene = saved

    def close(self) -> None:
        self._scene = None


# ---------------------------------------------------------------------------------------------
# The env
# ---------------------------------------------------------------------------------------------

class PrimitiveSkillEnv:
    """Tabletop manipulation with pick/place/push skills, four tasks, a kinematic simulator and an oracle."""

    Config = PrimitiveSkillConfig
    judge_spec = JudgeSpec(
        object_weights={"red_cube": 0.2, "green_cube": 0.2, "purple_cube": 0.15, "apple": 0.15, "drawer": 0.1,
                        "handle": 0.05, "left_target": 0.075, "right_target": 0.075},
        synonyms={"red_cube": ("red cube", "red block"), "green_cube": ("green cube", "green block"),
                  "purple_cube": ("purple cube", "purple block"), "apple": ("apple",),
                  "drawer": ("drawer",), "handle": ("handle", "drawer handle"),
                  "left_target": ("left target", "left goal", "left marker"),
                  "right_target": ("right target", "right goal", "right marker")},
    )
    action_names = ACTIONS
    action_sep = ACTION_SEP
    #: upper bounds checked by make() and the env server (vagent/envs/limits.py; docs/envs.md)
    config_bounds = {"image_size": (16, 512), **{f"{k}_tolerance": (0, 1000) for k in ("grasp", "push", "stack", "place_z", "align")}}
    #: only the operator of an env server sets this (the maniskill backend starts a physics simulator and renderer)
    server_only = ("backend",)

    def __init__(self, config: PrimitiveSkillConfig | None = None) -> None:
        cfg = config if config is not None else PrimitiveSkillConfig()
        check_common_config(cfg, "primitive_skill")
        if cfg.task not in TASKS:
            close = difflib.get_close_matches(str(cfg.task), TASKS, n=1)
            hint = f" Did you mean '{close[0]}'?" if close else ""
            raise ConfigError(f"primitive_skill.task: unknown task {cfg.task!r}.{hint} Valid: {', '.join(TASKS)}.")
        if cfg.backend not in BACKENDS:
            raise ConfigError(f"primitive_skill.backend: expected one of {', '.join(BACKENDS)}, got {cfg.backend!r}.")
        for name in ("grasp_tolerance", "push_tolerance", "stack_tolerance", "place_z_tolerance", "align_tolerance"):
            if not getattr(cfg, name) > 0:
                raise ConfigError(f"primitive_skill.{name}: expected a positive number of mm, "
                                  f"got {getattr(cfg, name)!r}.")
        self.config = cfg
        self.rewards = resolve_rewards(cfg, REWARD_PRESETS, "primitive_skill")
        self.task = get_task(cfg.task)
        self.params = TaskParams(align_tolerance=cfg.align_tolerance, drawer_close=cfg.drawer_close)
        self.bounds = Bounds()
        self.tol = Tolerances(cfg.grasp_tolerance, cfg.push_tolerance, cfg.stack_tolerance, cfg.place_z_tolerance)
        if cfg.backend == "maniskill":
            from vagent.envs.primitive_skill.maniskill import ManiSkillBackend

            self._backend: Backend = ManiSkillBackend(self.task, self.bounds, self.tol, cfg.image_size)
        else:
            self._backend = KinematicBackend(self.task, self.bounds, self.tol)
        self._clock = EpisodeClock("primitive_skill", cfg.max_steps)
        self._reminder = format_reminder(cfg.format, cfg.description_style, ACTION_SEP, cfg.max_actions_per_turn,
                                         style_text=STYLE_TEXT[cfg.description_style])
        self._prompt: str | None = None

    # -- contract ---------------------------------------------------------------------------
    def reset(self, seed: int) -> tuple[Observation, dict]:
        self._backend.reset(int(seed))
        self._clock.reset()
        scene = self._backend.scene()
        return self._observation(""), {"success": False, "stage": stage_of(scene, self.task, self.params)}

    def step(self, response: str) -> StepResult:
        self._clock.tick()
        cfg, r = self.config, self.rewards
        ps = parse_primitive_response(response, cfg.format, cfg.max_actions_per_turn)
        before = self._progress()
        executed, failed = self._execute(ps.skills)
        after = self._progress()
        success = bool(self.task.success(self._backend.scene(), self.params))
        reward = (after - before) - r["action_cost"] * len(executed)
        reward += format_reward(ps.parsed, len(executed), r["format"])
        truncated = self._clock.finish(success)
        scene = self._backend.scene()
        info = {
            "action_is_valid": ps.all_valid and failed is None,
            "action_is_effective": any(res.changed for _, res in executed),
            "n_valid_actions": len(executed),
            "format_ok": ps.parsed.format_ok,
            "format_error": ps.parsed.error,
            "success": success,
            "executed_actions": [s.text() for s, _ in executed],
            "skill_error": failed[1].message if failed else ps.invalid_reason,
            "stage": stage_of(scene, self.task, self.params),
            "progress": after,
            "held_object": scene.held,
        }
        return StepResult(self._observation(self._feedback(ps, executed, failed, success)), float(reward),
                          success, truncated, info)

    def system_prompt(self) -> str:
        if self._prompt is None:
            self._prompt = self._build_prompt()
        return self._prompt

    def state(self) -> dict:
        self._clock.require_started()
        return make_state(self._backend.scene(), self.task, self.params)

    def close(self) -> None:
        self._backend.close()
        self._clock.close()

    def predict_state(self, response: str) -> dict:
        """``state()`` after ``step(response)``, the env left as it was (no turn counted): the
        ``<prediction>`` of the solver's and the demos' replies. The skills run, then the backend's
        snapshot from before them is put back: a copy of the scene (kinematic), or the simulator's
        saved state (ManiSkill, whose simulator cannot be deep-copied; the prediction is the
        simulated outcome and costs the skills' simulation time)."""
        self._clock.require_started()
        ps = parse_primitive_response(response, self.config.format, self.config.max_actions_per_turn)
        saved = self._backend.save()
        try:
            self._execute(ps.skills)
            return make_state(self._backend.scene(), self.task, self.params)
        finally:
            self._backend.restore(saved)

    def random_action(self, rng: np.random.Generator) -> str:
        """A random, well-formed skill call aimed at the scene (``vagent play --policy random``, the
        random actions of ``vagent demos``): ``pick`` at a random object's centre, ``place`` the
        held object (else a cube's size) at a random table point at its resting height, or ``push``
        from 10 mm beside a random object towards it, 20 to 80 mm along x or y; whole mm, inside the
        workspace. Many still fail (a covered cube, an empty gripper): the env says why."""
        self._clock.require_started()
        scene, b = self._backend.scene(), self.bounds
        body = list(scene.bodies.values())[int(rng.integers(len(scene.bodies)))]
        x, y, z = body.pos
        skill = ACTIONS[int(rng.integers(len(ACTIONS)))]

        def clip(v: float, lo_hi: tuple[float, float]) -> float:
            return float(round(min(max(v, lo_hi[0]), lo_hi[1])))

        if skill == "pick":
            args: tuple[float, ...] = (clip(x, b.x), clip(y, b.y), clip(z, b.z))
        elif skill == "place":
            held = scene.bodies.get(scene.held) if scene.held else None
            half_z = held.half[2] if held is not None else body.half[2]
            args = (clip(rng.uniform(*b.x), b.x), clip(rng.uniform(*b.y), b.y), clip(half_z, b.z))
        else:
            axis, sign = int(rng.integers(2)), float(rng.choice((-1.0, 1.0)))  # push along +-x or +-y
            start = [x, y]
            start[axis] -= sign * (body.half[axis] + 10.0)
            end = list(start)
            end[axis] += sign * float(rng.uniform(20.0, 80.0))
            args = (clip(start[0], b.x), clip(start[1], b.y), clip(z, b.z),
                    clip(end[0], b.x), clip(end[1], b.y), clip(z, b.z))
        return Skill(skill, args).text()

    def optimal_actions(self) -> list[str]:
        """The oracle's remaining plan from the current scene (tasks.py); [] once solved."""
        self._clock.require_started()
        return [s.text() for s in self.task.plan(self._backend.scene(), self.params)]

    # -- helpers ----------------------------------------------------------------------------
    def _execute(self, skills) -> tuple[list[tuple[Skill, SkillResult]], tuple[Skill, SkillResult] | None]:
        """Run ``skills`` in order until one fails or the task is solved: (executed, failed or None)."""
        executed: list[tuple[Skill, SkillResult]] = []
        for skill in skills:
            res = self._backend.apply(skill)
            if not res.ok:
                return executed, (skill, res)
            executed.append((skill, res))
            if self.task.success(self._backend.scene(), self.params):
                break
        return executed, None

    def _progress(self) -> float:
        r = self.rewards
        return progress_value(self._backend.scene(), self.task, self.params, r["stage"], r["success"])

    def _feedback(self, ps: ParsedSkills, executed, failed, success: bool) -> str:
        return feedback_line(ps, executed, failed, success)

    def _observation(self, feedback: str) -> Observation:
        cfg = self.config
        scene = self._backend.scene()
        parts = [feedback] if feedback else []
        parts.append(f"Task: {self.task.instruction(self.params)}")
        images: tuple[Image.Image, ...] = ()
        if cfg.render == "vision":
            parts.append(f"Current observation: {IMAGE_PLACEHOLDER}")
            images = (self._backend.render(cfg.image_size),)
        else:
            parts.append("Current observation:")
        parts += scene_lines(scene)
        parts.append(self._reminder)
        return Observation("\n".join(parts), images)

    def _build_prompt(self) -> str:
        return system_prompt_text(self.config, self.task, self.params, self.bounds, self.tol)
