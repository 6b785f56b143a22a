"""The scripted oracle of PrimitiveSkill's tasks (``optimal_actions``; see
:mod:`vagent.envs.primitive_skill.tasks`).

Planners simulate every skill on a copy of the scene (an error there is a bug: ``RuntimeError``)
and return the whole remaining plan from the current scene, so a policy may execute any prefix.
"""

from __future__ import annotations

import math
from typing import Callable, Iterable, Sequence

import numpy as np

from vagent.envs.primitive_skill.goals import (
    _PLACE_GOALS, TaskParams, _drawer, aligned, apple_in_drawer, in_target, on, success_drawer,
)
from vagent.envs.primitive_skill.objects import DRAWER, TABLE, Drawer, Rect, Skill, Target, dist_xy, overlap
from vagent.envs.primitive_skill.scenes import APPLE_HALF, CUBE_HALF, _grow
from vagent.envs.primitive_skill.sim import Scene


class _Planner:
    """Builds a plan by running each skill on its own copy of the scene."""

    def __init__(self, scene: Scene, avoid_rects: Iterable[Rect] = (), avoid_discs: Iterable[Target] = ()):
        self.s = scene.copy()
        self.plan: list[Skill] = []
        self.avoid_rects = list(avoid_rects)
        self.avoid_discs = list(avoid_discs)

    def do(self, skill: Skill) -> None:
        res = self.s.apply(skill)
        if not res.ok:
            raise RuntimeError(f"primitive_skill oracle bug: {skill.text()} failed: {res.message}")
        self.plan.append(skill)

    def pick(self, name: str) -> None:
        if self.s.held != name:
            self.do(Skill("pick", self.s.bodies[name].pos))

    def place(self, x: float, y: float, z: float) -> None:
        self.do(Skill("place", (x, y, z)))

    def free_spot(self, name: str, prefer: Sequence[float], x_fixed: float | None = None) -> tuple[float, float]:
        """The free table spot for ``name`` nearest to ``prefer`` (10 mm grid, or the line
        x = ``x_fixed`` on a 5 mm grid) outside the avoided regions."""
        s, b = self.s, self.s.bodies[name]
        (x0, x1), (y0, y1) = s.bounds.x, s.bounds.y
        hx, hy = b.half[0], b.half[1]
        step = 5.0 if x_fixed is not None else 10.0
        xs = [x_fixed] if x_fixed is not None else list(np.arange(math.ceil((x0 + hx) / 10) * 10, x1 - hx + 1e-9, 10.0))
        ys = list(np.arange(math.ceil((y0 + hy) / step) * step, y1 - hy + 1e-9, step))
        cands = sorted(((float(x), float(y)) for x in xs for y in ys),
                       key=lambda c: (round(dist_xy(c, prefer), 6), c))
        for x, y in cands:
            fp = b.footprint(x, y)
            if any(overlap(fp, r) for r in self.avoid_rects):
                continue
            if any(dist_xy((x, y), (t.x, t.y)) < t.radius + max(hx, hy) for t in self.avoid_discs):
                continue
            land = s.landing(b, x, y)
            if not isinstance(land, str) and land[0] == TABLE:
                return x, y
        raise RuntimeError(f"primitive_skill oracle: no free spot on the table for the {name}")

    def relocate(self, name: str, spot: Callable[[str], tuple[float, float]] | None = None) -> None:
        """Move ``name`` (after clearing what is on it) to a free table spot."""
        self.clear_top(name, spot)
        b = self.s.bodies[name]
        prefer = b.pos
        self.pick(name)
        x, y = spot(name) if spot is not None else self.free_spot(name, prefer)
        self.place(x, y, b.half[2])

    def clear_top(self, name: str, spot: Callable[[str], tuple[float, float]] | None = None) -> None:
        for top in self.s.on_top_of(name):
            self.relocate(top, spot)


def plan_align(scene: Scene, p: TaskParams) -> list[Skill]:
    pl = _Planner(scene)
    s = pl.s

    def line_spot(name: str) -> tuple[float, float]:
        return pl.free_spot(name, s.bodies[name].pos, x_fixed=0.0)

    if s.held is not None:
        name = s.held
        x, y = line_spot(name)
        pl.place(x, y, s.bodies[name].half[2])
    for name in list(s.bodies):
        if aligned(s, name, p):
            continue
        pl.clear_top(name, line_spot)
        b = s.bodies[name]
        if b.support == TABLE and b.pos[0] != 0:
            sign = 1.0 if b.pos[0] > 0 else -1.0
            x, y, z = b.pos
            push = Skill("push", (x + sign * (b.half[0] + 5), y, z, sign * b.half[0], y, z))  # 5 mm gap
            probe = s.copy()
            if probe.apply(push).ok and aligned(probe, name, p):
                pl.do(push)
                continue
        pl.relocate(name, line_spot)
    return pl.plan


def plan_place(scene: Scene, p: TaskParams) -> list[Skill]:
    pl = _Planner(scene, avoid_discs=scene.targets.values())
    s = pl.s
    if s.held is not None:
        name = s.held
        t = s.targets.get(_PLACE_GOALS.get(name, ""))
        land = s.landing(s.bodies[name], t.x, t.y) if t is not None else "no goal"
        if t is not None and not isinstance(land, str) and land[0] == TABLE:
            pl.place(t.x, t.y, s.bodies[name].half[2])
        else:
            x, y = pl.free_spot(name, s.bodies[name].pos)
            pl.place(x, y, s.bodies[name].half[2])
    for cube, target in _PLACE_GOALS.items():
        if in_target(s, cube, target):
            continue
        t, b = s.targets[target], s.bodies[cube]
        mine = set(s.stack_above(cube))
        for o in list(s.bodies.values()):
            if o.name not in mine and o.support == TABLE and overlap(b.footprint(t.x, t.y), o.footprint()):
                pl.relocate(o.name)
        pl.clear_top(cube)
        pl.pick(cube)
        pl.place(t.x, t.y, b.half[2])
    return pl.plan


def plan_stack(scene: Scene, p: TaskParams) -> list[Skill]:
    """Red onto green (first taking green off purple if it stands on it), then purple onto red.
    A held cube goes where the rest of the plan wants it, so re-planning after any prefix of a plan
    continues that plan instead of undoing it."""
    pl = _Planner(scene)
    s = pl.s

    def green_ok() -> bool:  # green may carry red: nothing on it and purple not under it
        return not s.on_top_of("green_cube") and "purple_cube" not in s.supports_below("green_cube")

    if s.held is not None:
        name = s.held
        if name == "red_cube" and green_ok():
            base: str | None = "green_cube"
        elif name == "purple_cube" and on(s, "red_cube", "green_cube") and not s.on_top_of("red_cube"):
            base = "red_cube"
        else:
            base = None
        if base is not None:
            bb = s.bodies[base]
            pl.place(bb.pos[0], bb.pos[1], bb.top + s.bodies[name].half[2])
        else:
            x, y = pl.free_spot(name, s.bodies[name].pos)
            pl.place(x, y, s.bodies[name].half[2])
    if not on(s, "red_cube", "green_cube") or "purple_cube" in s.supports_below("green_cube"):
        if "purple_cube" in s.supports_below("green_cube"):
            pl.relocate("green_cube")
        pl.clear_top("green_cube")
        pl.clear_top("red_cube")
        pl.pick("red_cube")
        g = s.bodies["green_cube"]
        pl.place(g.pos[0], g.pos[1], g.top + CUBE_HALF[2])
    if not on(s, "purple_cube", "red_cube"):
        pl.clear_top("red_cube")
        pl.clear_top("purple_cube")
        pl.pick("purple_cube")
        r = s.bodies["red_cube"]
        pl.place(r.pos[0], r.pos[1], r.top + CUBE_HALF[2])
    return pl.plan


def plan_drawer(scene: Scene, p: TaskParams) -> list[Skill]:
    d0 = _drawer(scene)
    sweep = _grow(d0.drawer_rect(d0.max_open), 5)
    pl = _Planner(scene, avoid_rects=[sweep, _grow(d0.cabinet_rect, 5)])
    s, d = pl.s, _drawer(pl.s)
    if success_drawer(s, p):
        return []
    if s.held == "apple":
        x, y = _drawer_spot(d)
        land = s.landing(s.bodies["apple"], x, y)
        if not isinstance(land, str) and land[0] == DRAWER:
            pl.place(x, y, d.floor_z + APPLE_HALF[2])
        else:
            x, y = pl.free_spot("apple", s.bodies["apple"].pos)
            pl.place(x, y, APPLE_HALF[2])
    if not apple_in_drawer(s):
        if d.open < d.max_open:
            outside = d.outside_rect(d.max_open)
            for o in list(s.bodies.values()):
                if o.support == TABLE and outside is not None and overlap(o.footprint(), outside):
                    pl.relocate(o.name)
            hx, hy, hz = d.handle
            pl.do(Skill("push", (hx, hy, hz, hx - (d.max_open - d.open), hy, hz)))
        pl.pick("apple")
        pl.place(*_drawer_spot(d), d.floor_z + APPLE_HALF[2])
    if p.drawer_close and d.open > p.closed_tolerance:
        hx, hy, hz = d.handle
        pl.do(Skill("push", (hx, hy, hz, hx + d.open, hy, hz)))
    return pl.plan


def _drawer_spot(d: Drawer) -> tuple[float, float]:
    """Where the oracle puts the apple: the centre of the drawer's open part."""
    c = d.exposed_interior()
    if c is None:
        return d.position[0], d.y
    return (c[0] + c[1]) / 2, d.y


__all__ = ["plan_align", "plan_place", "plan_stack", "plan_drawer"]
