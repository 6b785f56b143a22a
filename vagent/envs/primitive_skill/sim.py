"""A deterministic kinematic tabletop: boxes on a table, target markers, a drawer and a gripper.

The default backend (``backend="maniskill"`` is the physical one, ``maniskill.py``). No physics, no
time: every skill either succeeds and moves things to their resting places, or fails with a reason
and changes nothing. All numbers are millimetres.

Frame: ``x`` points away from the robot base (forward), ``y`` to the robot's left, ``z`` up; the
table top is ``z = 0``. Every position is an object's centre. Objects are axis-aligned boxes
(``half`` extents); the apple is a 60 mm box drawn as a disc.

Skills (``Skill``; the gripper holds at most one object):

- ``pick(x, y, z)``: the gripper must be empty. Picks the object whose centre is within
  ``grasp_tolerance`` of ``(x, y)`` horizontally and whose height span (bottom - tol .. top + tol)
  contains ``z`` (of several, the one whose centre is nearest in z). Fails if another object rests
  on it, or if it lies in the part of the drawer that is inside the cabinet. The object is lifted
  to ``CARRY_Z``.
- ``place(x, y, z)``: the gripper must hold an object. It comes to rest with its centre at
  ``(x, y)``: on the table if nothing is below its footprint; snapped onto a cube's centre when it
  is within ``stack_tolerance`` of that cube (the highest one below); inside the drawer when its
  footprint lies in the drawer's open part. It fails when the footprint leaves the table, overlaps
  another object off-centre (or a non-stackable one, the apple), or hits the cabinet/drawer walls,
  and when ``z`` is more than ``place_z_tolerance`` below the resting centre (it would be pressed
  into what is below). A higher ``z`` drops it.
- ``push(x1, y1, z1, x2, y2, z2)``: the gripper must be empty. Starting within
  ``push_tolerance`` of the drawer handle it drags the drawer along x by ``x2 - x1`` (clamped to
  ``[0, max_open]``), with everything inside. Otherwise the segment must first touch an object
  standing on the table within ``push_tolerance`` of ``(x1, y1)``, at a height between its bottom
  and top (both ``z1`` and ``z2``); the object (with whatever is stacked on it) slides by the part
  of the segment after contact, ``(1 - t_contact) (p2 - p1)`` in xy. It fails if the object would
  leave the table or hit another object, the cabinet or the drawer (checked every 5 mm).

Every point must be within the workspace (``Bounds``, the robot's reach); out-of-reach targets fail
(VAGEN clips them to the workspace instead, which hides the model's mistake).

The records (bodies, the drawer, skills, ...) and the rectangle geometry are in
:mod:`vagent.envs.primitive_skill.objects`; their names are importable from here too.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Sequence

from vagent.envs.primitive_skill.objects import (  # noqa: F401 - re-exported: the tabletop's records
    _EPS, DRAWER, GRIPPER, SKILL_ARITY, TABLE, Body, Bounds, Drawer, Rect, Skill, SkillResult, Target, Tolerances, Vec,
    dist_xy, fmt_num, fmt_point, inside, overlap, ray_entry, shift,
)

#: height (mm) of a held object's centre: above every stack and the cabinet
CARRY_Z = 160.0
#: the gripper's position at the start of an episode
HOME = (0.0, 0.0, 200.0)
_SWEEP_STEP = 5.0


# ---------------------------------------------------------------------------------------------
# The scene
# ---------------------------------------------------------------------------------------------

@dataclass
class Scene:
    """Everything on the table. ``bodies`` keep their insertion order (deterministic iteration)."""

    bodies: dict[str, Body]
    targets: dict[str, Target] = field(default_factory=dict)
    drawer: Drawer | None = None
    gripper: Vec = HOME
    held: str | None = None
    bounds: Bounds = field(default_factory=Bounds)
    tol: Tolerances = field(default_factory=Tolerances)

    def copy(self) -> "Scene":
        return copy.deepcopy(self)

    # -- queries ------------------------------------------------------------------------------
    def on_top_of(self, name: str) -> list[str]:
        """Names of the bodies resting directly on ``name``."""
        return [b.name for b in self.bodies.values() if b.support == name]

    def stack_above(self, name: str) -> list[str]:
        """``name`` and everything resting on it, transitively (bottom first)."""
        out, frontier = [name], [name]
        while frontier:
            nxt = [n for f in frontier for n in self.on_top_of(f)]
            out += nxt
            frontier = nxt
        return out

    def supports_below(self, name: str) -> list[str]:
        """The bodies under ``name`` (its support chain, nearest first)."""
        out, cur = [], self.bodies[name].support
        while cur in self.bodies:
            out.append(cur)
            cur = self.bodies[cur].support
        return out

    def base_support(self, name: str) -> str:
        """What the bottom of ``name``'s stack rests on (table, drawer, gripper)."""
        chain = self.supports_below(name)
        return self.bodies[chain[-1] if chain else name].support

    def fixture_rects(self) -> list[tuple[str, Rect]]:
        """Static obstacles on the table: the cabinet and the part of the drawer outside it."""
        if self.drawer is None:
            return []
        out = [("the cabinet", self.drawer.cabinet_rect)]
        o = self.drawer.outside_rect()
        if o is not None:
            out.append(("the drawer", o))
        return out

    def hidden_in_cabinet(self, name: str) -> bool:
        """The body lies (partly) in the part of the drawer that is inside the cabinet."""
        d = self.drawer
        if d is None or self.base_support(name) != DRAWER:
            return False
        return self.bodies[name].footprint()[1] > d.front_x + _EPS

    # -- skills -------------------------------------------------------------------------------
    def apply(self, skill: Skill) -> SkillResult:
        """Run one skill; on failure nothing changes."""
        for i in range(0, len(skill.args), 3):
            why = self.bounds.violation(skill.args[i:i + 3])
            if why is not None:
                return SkillResult(False, f"{skill.text()} is out of reach: {why}")
        if skill.name == "pick":
            return self._pick(skill.args)
        if skill.name == "place":
            return self._place(skill.args)
        return self._push(skill.args[:3], skill.args[3:])

    def _pick(self, p: Sequence[float]) -> SkillResult:
        if self.held is not None:
            return SkillResult(False, f"the gripper already holds the {self.held}; place it before picking")
        tol = self.tol.grasp
        cands = [b for b in self.bodies.values()
                 if b.support != GRIPPER and dist_xy(p, b.pos) <= tol + _EPS and b.bottom - tol <= p[2] <= b.top + tol]
        if not cands:
            return SkillResult(False, f"no object to grasp at {fmt_point(p)}: pick needs an object's centre within "
                                      f"{fmt_num(tol)} mm horizontally and a height within its span")
        b = min(cands, key=lambda c: abs(p[2] - c.pos[2]))
        above = self.on_top_of(b.name)
        if above:
            return SkillResult(False, f"cannot pick the {b.name}: the {above[0]} is on top of it; move that first")
        if self.hidden_in_cabinet(b.name):
            return SkillResult(False, f"cannot pick the {b.name}: it is inside the cabinet; open the drawer first")
        b.pos, b.support = (b.pos[0], b.pos[1], CARRY_Z), GRIPPER
        self.held, self.gripper = b.name, b.pos
        return SkillResult(True, f"picked up the {b.name}", True)

    def _fixture_clash(self, name: str, fp: Rect) -> str | None:
        """Why footprint ``fp`` hits the cabinet or drawer (fine inside the drawer's open part)."""
        d = self.drawer
        if d is None or not any(overlap(fp, r) for _, r in self.fixture_rects()):
            return None
        cavity = d.exposed_interior()
        if cavity is not None and inside(fp, cavity):
            return None
        return (f"the {name} would hit the cabinet or the drawer walls; to put it into the drawer, open the drawer "
                "and place it inside the open part")

    def landing(self, b: Body, x: float, y: float) -> tuple[str, float, float, float] | str:
        """(support, x, y, resting centre z) of ``b`` placed at (x, y), or why it cannot land there."""
        fp = b.footprint(x, y)
        if not inside(fp, self.bounds.table):
            return f"the {b.name} would stick out of the table at ({fmt_num(x)}, {fmt_num(y)})"
        clash = self._fixture_clash(b.name, fp)
        if clash:
            return clash
        others = [o for o in self.bodies.values() if o.name != b.name and o.support != GRIPPER]
        hits = [o for o in others if overlap(fp, o.footprint())]
        if not hits:
            d = self.drawer
            if d is not None and (c := d.exposed_interior()) is not None and inside(fp, c):
                return DRAWER, x, y, d.floor_z + b.half[2]
            return TABLE, x, y, b.half[2]
        top = max(hits, key=lambda o: (o.top, -list(self.bodies).index(o.name)))
        if not top.stackable:
            return f"the {b.name} would land on the {top.name}, which cannot carry objects"
        if dist_xy((x, y), top.pos) > self.tol.stack + _EPS:
            return (f"the {b.name} would land off-centre on the {top.name} ({fmt_num(dist_xy((x, y), top.pos))} mm "
                    f"from its centre; stacking needs {fmt_num(self.tol.stack)} mm or less)")
        sx, sy = top.pos[0], top.pos[1]
        snapped = b.footprint(sx, sy)
        below = set(self.supports_below(top.name)) | {top.name}
        hit = [o for o in others if o.name not in below and overlap(snapped, o.footprint())]
        if hit:
            return f"the {b.name} would hit the {hit[0].name}"
        clash = self._fixture_clash(b.name, snapped)
        if clash:
            return clash
        return top.name, sx, sy, top.top + b.half[2]

    def _place(self, p: Sequence[float]) -> SkillResult:
        if self.held is None:
            return SkillResult(False, "the gripper is empty; pick an object before placing")
        b = self.bodies[self.held]
        land = self.landing(b, p[0], p[1])
        if isinstance(land, str):
            return SkillResult(False, land)
        support, x, y, z = land
        if p[2] < z - self.tol.place_z - _EPS:
            where = "the table" if support == TABLE else f"the {support}"
            return SkillResult(False, f"z={fmt_num(p[2])} is too low: the {b.name} would be pressed into {where} "
                                      f"(its centre rests at z={fmt_num(z)})")
        b.pos, b.support = (x, y, z), support
        self.held, self.gripper = None, (x, y, CARRY_Z)
        where = "on the table" if support == TABLE else "in the drawer" if support == DRAWER else f"on the {support}"
        return SkillResult(True, f"placed the {b.name} {where} at {fmt_point(b.pos)}", True)

    def _push(self, p1: Sequence[float], p2: Sequence[float]) -> SkillResult:
        if self.held is not None:
            return SkillResult(False, f"the gripper holds the {self.held}; place it before pushing")
        dx, dy = p2[0] - p1[0], p2[1] - p1[1]
        if math.hypot(dx, dy) < 1.0:
            return SkillResult(False, "push needs a horizontal movement of at least 1 mm")
        d = self.drawer
        if d is not None and math.dist(p1, d.handle) <= self.tol.push + _EPS:
            return self._slide_drawer(dx, p2)
        hit = self._first_contact(p1, p2)
        if isinstance(hit, str):
            return SkillResult(False, hit)
        body, t = hit
        if body.support != TABLE:
            return SkillResult(False, f"cannot push the {body.name}: it does not stand on the table")
        mx, my = (1.0 - t) * dx, (1.0 - t) * dy
        moved = self.stack_above(body.name)
        blocked = self._sweep(moved, mx, my)
        if blocked:
            return SkillResult(False, blocked)
        for n in moved:
            b = self.bodies[n]
            b.pos = (b.pos[0] + mx, b.pos[1] + my, b.pos[2])
        self.gripper = (p2[0], p2[1], p2[2])
        return SkillResult(True, f"pushed the {body.name} to {fmt_point(body.pos)}", math.hypot(mx, my) > _EPS)

    def _first_contact(self, p1: Sequence[float], p2: Sequence[float]) -> tuple[Body, float] | str:
        dx, dy = p2[0] - p1[0], p2[1] - p1[1]
        length = math.hypot(dx, dy)
        best: tuple[Body, float] | None = None
        for b in self.bodies.values():
            if b.support == GRIPPER or not (b.bottom <= p1[2] <= b.top and b.bottom <= p2[2] <= b.top):
                continue
            fp = b.footprint()
            if fp[0] < p1[0] < fp[1] and fp[2] < p1[1] < fp[3]:
                return f"the push starts inside the {b.name}; start next to its side"
            t = ray_entry(p1[0], p1[1], dx, dy, fp)
            if t is not None and (best is None or t < best[1]):
                best = (b, t)
        if best is None:
            return ("the push touched nothing: start within "
                    f"{fmt_num(self.tol.push)} mm of an object's side, at a height between its bottom and top, "
                    "and move towards it")
        gap = best[1] * length
        if gap > self.tol.push + _EPS:
            return (f"the push starts {fmt_num(gap)} mm from the {best[0].name}; start within "
                    f"{fmt_num(self.tol.push)} mm of its side")
        return best

    def _sweep(self, moved: Sequence[str], mx: float, my: float) -> str | None:
        """Why moving the bodies ``moved`` by (mx, my) collides, checked every 5 mm; else None."""
        n = max(1, math.ceil(math.hypot(mx, my) / _SWEEP_STEP))
        others = [o for o in self.bodies.values() if o.name not in moved and o.support != GRIPPER]
        for k in range(1, n + 1):
            ox, oy = mx * k / n, my * k / n
            for name in moved:
                fp = shift(self.bodies[name].footprint(), ox, oy)
                if not inside(fp, self.bounds.table):
                    return f"the {name} would be pushed off the table"
                for o in others:
                    if overlap(fp, o.footprint()):
                        return f"the {name} would hit the {o.name}"
                for what, r in self.fixture_rects():
                    if overlap(fp, r):
                        return f"the {name} would hit {what}"
        return None

    def _slide_drawer(self, dx: float, p2: Sequence[float]) -> SkillResult:
        d = self.drawer
        assert d is not None
        new = min(max(d.open - dx, 0.0), d.max_open)
        if abs(new - d.open) < _EPS:
            state = "fully open" if d.open >= d.max_open - _EPS else "closed" if d.open <= _EPS else "blocked"
            return SkillResult(True, f"the drawer did not move (it is {state})", False)
        if new > d.open:
            sweep = d.outside_rect(new)
            inside_names = {n for b in self.bodies.values() if b.support == DRAWER for n in self.stack_above(b.name)}
            for o in self.bodies.values():
                if o.name not in inside_names and o.support != GRIPPER and overlap(o.footprint(), sweep):
                    return SkillResult(False, f"the drawer would hit the {o.name}")
        delta = new - d.open
        for b in list(self.bodies.values()):
            if b.support == DRAWER:
                for n in self.stack_above(b.name):
                    o = self.bodies[n]
                    o.pos = (o.pos[0] - delta, o.pos[1], o.pos[2])
        d.open = new
        self.gripper = (d.handle[0], d.handle[1], p2[2])
        verb = "pulled the drawer open" if delta > 0 else "pushed the drawer closed"
        return SkillResult(True, f"{verb} to {fmt_num(new)} mm", True)
