"""What PrimitiveSkill's tasks ask for (:mod:`vagent.envs.primitive_skill.tasks`): the task
options, the predicates on a scene, and each task's stage flags and success test. Pure."""

from __future__ import annotations

from dataclasses import dataclass

from vagent.envs.primitive_skill.objects import DRAWER, GRIPPER, TABLE, Drawer, dist_xy
from vagent.envs.primitive_skill.sim import Scene


@dataclass(frozen=True)
class TaskParams:
    """Task options (from the env config)."""

    #: align: largest |x| (mm) of an aligned cube
    align_tolerance: float = 10.0
    #: drawer: the drawer must also be closed at the end (VAGEN's PutAppleInDrawer)
    drawer_close: bool = False
    #: drawer: opening (mm) from which the drawer counts as open (the apple fits from ~68 mm)
    open_threshold: float = 70.0
    #: drawer: largest opening (mm) that counts as closed
    closed_tolerance: float = 5.0


def aligned(s: Scene, name: str, p: TaskParams) -> bool:
    b = s.bodies[name]
    return b.support == TABLE and abs(b.pos[0]) <= p.align_tolerance + 1e-9


def in_target(s: Scene, name: str, target: str) -> bool:
    """Released and within the target's radius (VAGEN's ``is_cube_in_goal`` and not grasped)."""
    b, t = s.bodies[name], s.targets[target]
    return b.support != GRIPPER and dist_xy(b.pos, (t.x, t.y)) <= t.radius + 1e-9


def on(s: Scene, top: str, base: str) -> bool:
    return s.bodies[top].support == base


def _drawer(s: Scene) -> Drawer:
    if s.drawer is None:
        raise ValueError("the drawer task needs a scene with a drawer")
    return s.drawer


def apple_in_drawer(s: Scene) -> bool:
    return s.bodies["apple"].support == DRAWER


_PLACE_GOALS = {"red_cube": "left_target", "green_cube": "right_target"}


def flags_align(s: Scene, p: TaskParams) -> tuple[bool, ...]:
    return (any(aligned(s, n, p) for n in s.bodies),)


def success_align(s: Scene, p: TaskParams) -> bool:
    return all(aligned(s, n, p) for n in s.bodies)


def flags_place(s: Scene, p: TaskParams) -> tuple[bool, ...]:
    red_in = in_target(s, "red_cube", "left_target")
    return (s.held == "red_cube", red_in, red_in and s.held == "green_cube")


def success_place(s: Scene, p: TaskParams) -> bool:
    return all(in_target(s, c, t) for c, t in _PLACE_GOALS.items())


def flags_stack(s: Scene, p: TaskParams) -> tuple[bool, ...]:
    red_on = on(s, "red_cube", "green_cube")
    return (s.held == "red_cube", red_on, red_on and s.held == "purple_cube")


def success_stack(s: Scene, p: TaskParams) -> bool:
    return on(s, "red_cube", "green_cube") and on(s, "purple_cube", "red_cube")


def flags_drawer(s: Scene, p: TaskParams) -> tuple[bool, ...]:
    is_open = _drawer(s).open >= p.open_threshold - 1e-9
    flags = (is_open, is_open and s.held == "apple")
    return flags + ((apple_in_drawer(s),) if p.drawer_close else ())


def success_drawer(s: Scene, p: TaskParams) -> bool:
    return apple_in_drawer(s) and (not p.drawer_close or _drawer(s).open <= p.closed_tolerance + 1e-9)


__all__ = ["TaskParams", "aligned", "in_target", "on", "apple_in_drawer", "flags_align", "success_align",
           "flags_place", "success_place", "flags_stack", "success_stack", "flags_drawer", "success_drawer"]
