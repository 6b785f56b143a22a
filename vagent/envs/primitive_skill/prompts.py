"""What PrimitiveSkill says: the system prompt with its example reply, the scene as text and the
feedback line about the last reply. Pure functions of the config, the task and the scene (see
:mod:`vagent.envs.primitive_skill.env`)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from vagent.envs.formats import FormatExample, format_instruction
from vagent.envs.primitive_skill.config import PrimitiveSkillConfig
from vagent.envs.primitive_skill.describe import describe_state, make_state
from vagent.envs.primitive_skill.replies import ACTION_SEP, ParsedSkills
from vagent.envs.primitive_skill.sim import Bounds, Scene, Skill, SkillResult, Tolerances, fmt_num, fmt_point
from vagent.envs.primitive_skill.tasks import Task, TaskParams

STYLE_TEXT = {
    "natural": ("Describe states in natural language, giving each object's centre as (x, y, z) in mm, "
                "e.g. 'The red cube is at (52, -80, 20).'"),
    "structured": ('Describe states as a JSON object mapping each object to its centre [x, y, z] in mm, '
                   'e.g. {"red_cube": [52, -80, 20]}.'),
    "symbolic": "Describe states symbolically, one object per line: name (x, y, z) in mm, e.g. red_cube (52, -80, 20).",
}
_EXAMPLE_SEED = 20240917


def feedback_line(ps: ParsedSkills, executed: Sequence[tuple[Skill, SkillResult]],
                  failed: tuple[Skill, SkillResult] | None, success: bool) -> str:
    """The feedback about the last reply: what ran, what failed or was invalid and why, success."""
    if not ps.parsed.format_ok:
        return f"Last reply: format error ({ps.parsed.error}); no action was executed."
    done = ", ".join(f"{s.text()} ({res.message})" for s, res in executed) or "nothing"
    line = f"Last reply: executed {done}."
    if failed is not None:
        line += f" {failed[0].text()} failed: {failed[1].message}; execution stopped there."
    elif ps.invalid is not None:
        line += f" Invalid action: {ps.invalid_reason}; execution stopped there."
    if success:
        line += " The task is complete!"
    return line


def scene_lines(scene: Scene) -> list[str]:
    """The scene as text: object centres, targets, the drawer, the gripper and what it holds."""
    lines = ["Object positions (x, y, z) in mm: "
             + ", ".join(f"{b.name} {fmt_point(b.pos)}" for b in scene.bodies.values()) + "."]
    if scene.targets:
        lines.append("Targets (centre, radius 50 mm): "
                     + ", ".join(f"{t.name} {fmt_point(t.pos)}" for t in scene.targets.values()) + ".")
    if scene.drawer is not None:
        d = scene.drawer
        lines.append(f"Drawer: open {fmt_num(d.open)} of {fmt_num(d.max_open)} mm; drawer {fmt_point(d.position)}, "
                     f"handle {fmt_point(d.handle)}.")
    lines.append(f"Gripper: at {fmt_point(scene.gripper)}, holding {scene.held or 'nothing'}.")
    return lines


def format_example(cfg: PrimitiveSkillConfig, task: Task, params: TaskParams, bounds: Bounds,
                   tol: Tolerances) -> FormatExample:
    """The example reply: the oracle's first skills on a fixed scene, with the true states before and after."""
    scene = task.build(np.random.default_rng(_EXAMPLE_SEED), bounds, tol)
    plan = task.plan(scene, params)[: cfg.max_actions_per_turn]
    before = make_state(scene, task, params)
    after_scene = scene.copy()
    for s in plan:
        after_scene.apply(s)
    after = make_state(after_scene, task, params)
    style = cfg.description_style
    return FormatExample(
        observation=describe_state(before, style),
        reasoning=f"To make progress on the task I {' then '.join(s.text() for s in plan)}.",
        prediction=describe_state(after, style),
        answer=ACTION_SEP.join(s.text() for s in plan),
    )


def system_prompt_text(cfg: PrimitiveSkillConfig, task: Task, params: TaskParams, bounds: Bounds,
                       tol: Tolerances) -> str:
    """The system prompt: the task, the frame, the skills and their tolerances, the workspace, the
    image (vision) and the format instruction with :func:`format_example`."""
    b, t = bounds, tol
    lines = [
        "You control a robot arm above a table with three primitive skills. "
        f"Task: {task.instruction(params)}",
        "Coordinates are millimetres in the robot's frame: x points away from the robot base, y to the "
        "robot's left, z up; the table top is z = 0. Positions are object centres; cubes are 40 mm wide, "
        "the apple 60 mm.",
        f"Skills (up to {cfg.max_actions_per_turn} per answer, separated by '{ACTION_SEP}'):",
        f"- pick(x, y, z): grasp the object whose centre is within {fmt_num(t.grasp)} mm of (x, y), with z within "
        "its height, and lift it. The gripper must be empty and nothing may rest on the object.",
        "- place(x, y, z): put the held object down with its centre at (x, y): on the table, onto a cube "
        f"(within {fmt_num(t.stack)} mm of that cube's centre it snaps onto it) or into the open part of the "
        f"drawer. z must not be more than {fmt_num(t.place_z)} mm below its resting centre height.",
        "- push(x1, y1, z1, x2, y2, z2): move the empty gripper from the first point to the second. Starting "
        f"within {fmt_num(t.push)} mm of an object's side, at a height within the object, and moving towards "
        "it slides the object along. Starting at the drawer handle drags the drawer along x (towards the "
        "robot opens it).",
        "A skill that cannot run (out of reach, empty or full gripper, a collision, nothing to grasp) fails "
        "and the rest of the answer is skipped.",
        f"Workspace (the arm's reach, also the table): x in [{fmt_num(b.x[0])}, {fmt_num(b.x[1])}], "
        f"y in [{fmt_num(b.y[0])}, {fmt_num(b.y[1])}], z in [{fmt_num(b.z[0])}, {fmt_num(b.z[1])}] mm.",
        f"The episode ends when the task is done or after {cfg.max_steps} turns.",
    ]
    if cfg.render == "vision" and cfg.backend == "maniskill":
        lines.append("Each observation has a top-down camera image of the table: the robot stands below the "
                     "bottom edge, x points up and y to the left; targets are red and white rings; raised "
                     "(stacked or held) objects look larger; while the arm holds an object its hand covers it.")
    elif cfg.render == "vision":
        lines.append("Each observation has a top-down image: the robot base is at the bottom, x points up and "
                     "y to the left, grid lines every 50 mm; targets are red and white rings, the cabinet and "
                     "drawer brown, the gripper grey; raised (stacked or held) objects look larger and cast a "
                     "shadow down-right.")
    lines.append(format_instruction(cfg.format, format_example(cfg, task, params, bounds, tol), cfg.description_style,
                                    ACTION_SEP, cfg.max_actions_per_turn, style_text=STYLE_TEXT[cfg.description_style]))
    return "\n".join(lines)


__all__ = ["STYLE_TEXT", "feedback_line", "scene_lines", "format_example", "system_prompt_text"]
