"""PrimitiveSkill (VAGEN's robot-manipulation env): the env (``env.py``), its reply parser
(``replies.py``), ground truth and descriptions (``describe.py``) and prompts (``prompts.py``);
our kinematic tabletop simulator (``sim.py``, its records and geometry in ``objects.py``); the
four tasks (``tasks.py``: initial scenes in ``scenes.py``, stage flags and success in
``goals.py``, the oracle in ``oracle.py``); the top-down renderer (``render.py``); and the
ManiSkill 3 backend (``maniskill.py`` with its motion planning in ``motion.py``, and the scene in
``tabletop.py``; never imported here)."""

from vagent.envs.primitive_skill.env import (
    ACTIONS, REWARD_PRESETS, KinematicBackend, ParsedSkills, PrimitiveSkillConfig, PrimitiveSkillEnv,
    describe_state, make_state, parse_primitive_response, parse_skill,
)
from vagent.envs.primitive_skill.render import render_scene
from vagent.envs.primitive_skill.sim import Body, Bounds, Drawer, Scene, Skill, SkillResult, Target, Tolerances
from vagent.envs.primitive_skill.tasks import TASK_TABLE, TASKS, Task, TaskParams, get_task, progress_value

__all__ = [
    "ACTIONS", "REWARD_PRESETS", "KinematicBackend", "ParsedSkills", "PrimitiveSkillConfig", "PrimitiveSkillEnv",
    "describe_state", "make_state", "parse_primitive_response", "parse_skill", "render_scene", "Body", "Bounds",
    "Drawer", "Scene", "Skill", "SkillResult", "Target", "Tolerances", "TASK_TABLE", "TASKS", "Task", "TaskParams",
    "get_task", "progress_value",
]
