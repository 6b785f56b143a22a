"""The four tasks of VAGEN's PrimitiveSkill suite on the kinematic tabletop (``sim.py``).

Each :class:`Task` has a scene builder (all randomness from the episode's ``numpy`` Generator),
stage flags, a success test and a scripted planner (the oracle behind ``optimal_actions``).

| task | VAGEN env | stage flags (each stage is worth ``stage`` reward) | success |
|---|---|---|---|
| ``align`` | AlignTwoCube | a cube aligned (abs(x) <= align_tolerance, on the table) | both aligned |
| ``place`` | PlaceTwoCube | red held; red on left target; red there, green held | red left, green right |
| ``stack`` | StackThreeCube | red held; red on green; red on green, purple held | purple on red on green |
| ``drawer`` | PutAppleInDrawer | open (>= open_threshold); open, apple held; [apple in] | apple in [and closed] |

The progress value of a scene is VAGEN's ``_compute_reward``: ``success`` if solved, else
``stage * (1 + highest stage index whose flag holds)`` (0 when none holds). Deviations on purpose:
our flags are *cumulative* where VAGEN's are not (VAGEN's stack stage 2 is "purple held" even if
red is not on green; its drawer starts open and stage 0 is "apple held"), so stages are reached
only in the task's order; and VAGEN's ``_compute_reward`` matches keys ``stage_<i>_success`` while
the ``evaluate`` of PlaceTwoCube, StackThreeCube and PutAppleInDrawer name them
``stage<i>_success`` (as read from its public code: unless a wrapper renames them, those stage
rewards were never paid); ours always are.

Modules: the scene builders are in ``scenes.py``, the task options, predicates, stage flags and
success tests in ``goals.py``, the planners in ``oracle.py``; this module holds the task table.

Planners simulate every skill on a copy of the scene (an error there is a bug: ``RuntimeError``)
and return the whole remaining plan from the current scene, so a policy may execute any prefix.
They are scripted, not proven shortest, but take the fewest skills from the initial scenes
(align: 1 push per cube; place/stack: pick + place per cube; drawer: pull, pick, place[, push]).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from vagent.envs.primitive_skill.goals import (  # noqa: F401 - re-exported
    TaskParams, aligned, apple_in_drawer, flags_align, flags_drawer, flags_place, flags_stack, in_target, on,
    success_align, success_drawer, success_place, success_stack,
)
from vagent.envs.primitive_skill.objects import Bounds, Skill, Tolerances
from vagent.envs.primitive_skill.oracle import plan_align, plan_drawer, plan_place, plan_stack
from vagent.envs.primitive_skill.scenes import (  # noqa: F401 - re-exported
    APPLE_HALF, COLORS, CUBE_HALF, build_align, build_drawer, build_place, build_stack,
)
from vagent.envs.primitive_skill.sim import Scene

TASKS = ("align", "place", "stack", "drawer")


@dataclass(frozen=True)
class Task:
    """One task: ``build`` a scene, its stage ``flags``, ``success``, the oracle ``plan`` and the
    ``instruction`` shown to the model."""

    name: str
    vagen_id: str
    build: Callable[[np.random.Generator, Bounds, Tolerances], Scene]
    flags: Callable[[Scene, TaskParams], tuple[bool, ...]]
    success: Callable[[Scene, TaskParams], bool]
    plan: Callable[[Scene, TaskParams], list[Skill]]
    instruction: Callable[[TaskParams], str]


def stages_done(flags: Sequence[bool]) -> int:
    """1 + the highest index of a true flag (0 when none is true): VAGEN's stage count."""
    return max((i + 1 for i, f in enumerate(flags) if f), default=0)


def stage_of(scene: Scene, task: Task, params: TaskParams) -> int:
    """Stages completed: ``stages_done(flags)``, or ``len(flags) + 1`` once the task is solved."""
    flags = task.flags(scene, params)
    return len(flags) + 1 if task.success(scene, params) else stages_done(flags)


def progress_value(scene: Scene, task: Task, params: TaskParams, stage: float, success: float) -> float:
    """``success`` if the task is solved, else ``stage * stages_done(flags)``."""
    if task.success(scene, params):
        return float(success)
    return float(stage) * stages_done(task.flags(scene, params))


TASK_TABLE: dict[str, Task] = {
    "align": Task(
        "align", "AlignTwoCube", build_align, flags_align, success_align, plan_align,
        lambda p: (f"Align the cubes along the y axis: move every cube so that its x coordinate is 0 "
                   f"(within {p.align_tolerance:g} mm), standing on the table."),
    ),
    "place": Task(
        "place", "PlaceTwoCube", build_place, flags_place, success_place, plan_place,
        lambda p: ("Place the red cube on the left target and the green cube on the right target "
                   "(its centre within 50 mm of the target's centre)."),
    ),
    "stack": Task(
        "stack", "StackThreeCube", build_stack, flags_stack, success_stack, plan_stack,
        lambda p: "Stack the red cube on top of the green cube, then stack the purple cube on top of the red cube.",
    ),
    "drawer": Task(
        "drawer", "PutAppleInDrawer", build_drawer, flags_drawer, success_drawer, plan_drawer,
        lambda p: ("Open the drawer by pulling its handle towards the robot (a push that starts at the handle), "
                   "then put the apple into the drawer" + (", then close the drawer." if p.drawer_close else ".")),
    ),
}


def get_task(name: str) -> Task:
    if name not in TASK_TABLE:
        raise KeyError(name)
    return TASK_TABLE[name]
