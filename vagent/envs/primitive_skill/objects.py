"""What the kinematic tabletop (:mod:`vagent.envs.primitive_skill.sim`) is made of: the workspace
bounds, the skill tolerances, bodies, target markers, the drawer, skills and their results, and the
pure rectangle geometry the skills use. All numbers are millimetres in the robot's frame (x
forward, y left, z up; the table top is z = 0); rectangles are ``(x0, x1, y0, y1)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

TABLE = "table"
DRAWER = "drawer"
GRIPPER = "gripper"
SKILL_ARITY = {"pick": 3, "place": 3, "push": 6}
_EPS = 1e-6

Vec = tuple[float, float, float]
Rect = tuple[float, float, float, float]  # (x0, x1, y0, y1)


def fmt_num(v: float) -> str:
    """A coordinate as text: an integer when it is whole, else one decimal ("12", "-3.5")."""
    r = round(float(v), 1)
    return str(int(round(r))) if abs(r - round(r)) < 1e-9 else f"{r:.1f}"


def fmt_point(p: Sequence[float]) -> str:
    return "(" + ", ".join(fmt_num(v) for v in p) + ")"


@dataclass(frozen=True)
class Bounds:
    """The workspace: the ranges of x, y and z (mm) the gripper can reach; x/y are also the table."""

    x: tuple[float, float] = (-100.0, 150.0)
    y: tuple[float, float] = (-200.0, 200.0)
    z: tuple[float, float] = (10.0, 200.0)

    def violation(self, p: Sequence[float]) -> str | None:
        """Why ``p`` is out of reach, or None."""
        for axis, v, (lo, hi) in zip("xyz", p, (self.x, self.y, self.z)):
            if not lo - _EPS <= v <= hi + _EPS:
                return f"{axis}={fmt_num(v)} is outside the workspace [{fmt_num(lo)}, {fmt_num(hi)}]"
        return None

    @property
    def table(self) -> Rect:
        return (self.x[0], self.x[1], self.y[0], self.y[1])


@dataclass(frozen=True)
class Tolerances:
    """How precise a skill's coordinates must be (mm)."""

    grasp: float = 15.0
    push: float = 25.0
    stack: float = 20.0
    place_z: float = 15.0


@dataclass
class Body:
    """A movable object: an axis-aligned box with centre ``pos`` resting on ``support``
    (``"table"``, ``"drawer"``, ``"gripper"`` when held, or another body's name)."""

    name: str
    kind: str  # "cube" | "apple"
    color: tuple[int, int, int]
    half: Vec
    pos: Vec
    support: str = TABLE

    @property
    def stackable(self) -> bool:
        """Other objects may rest on it (cubes only)."""
        return self.kind == "cube"

    def footprint(self, x: float | None = None, y: float | None = None) -> Rect:
        cx = self.pos[0] if x is None else x
        cy = self.pos[1] if y is None else y
        return (cx - self.half[0], cx + self.half[0], cy - self.half[1], cy + self.half[1])

    @property
    def bottom(self) -> float:
        return self.pos[2] - self.half[2]

    @property
    def top(self) -> float:
        return self.pos[2] + self.half[2]


@dataclass(frozen=True)
class Target:
    """A flat target marker (no collision): a disc of ``radius`` around ``(x, y)`` on the table."""

    name: str
    x: float
    y: float
    radius: float = 50.0

    @property
    def pos(self) -> Vec:
        return (self.x, self.y, 0.0)


@dataclass
class Drawer:
    """A cabinet whose front face is at ``front_x`` (facing the robot) with one drawer sliding out
    along -x by ``open`` mm (0 = closed). Objects inside have ``support == "drawer"``."""

    front_x: float
    y: float
    depth: float = 110.0
    width: float = 140.0
    side: float = 10.0
    height: float = 120.0
    floor_z: float = 15.0
    wall: float = 8.0
    max_open: float = 100.0
    handle_out: float = 15.0
    handle_z: float = 60.0
    open: float = 0.0

    @property
    def cabinet_rect(self) -> Rect:
        hw = self.width / 2 + self.side
        return (self.front_x, self.front_x + self.depth, self.y - hw, self.y + hw)

    def drawer_rect(self, open_mm: float | None = None) -> Rect:
        d = self.open if open_mm is None else open_mm
        return (self.front_x - d, self.front_x + self.depth - d, self.y - self.width / 2, self.y + self.width / 2)

    def outside_rect(self, open_mm: float | None = None) -> Rect | None:
        """The part of the drawer sticking out of the cabinet (None when closed)."""
        d = self.open if open_mm is None else open_mm
        if d <= _EPS:
            return None
        return (self.front_x - d, self.front_x, self.y - self.width / 2, self.y + self.width / 2)

    def exposed_interior(self) -> Rect | None:
        """Where an object can be put into the drawer from above (None when closed)."""
        x0 = self.front_x - self.open + self.wall
        x1 = min(self.front_x, self.front_x + self.depth - self.open - self.wall)
        if x1 - x0 <= _EPS:
            return None
        return (x0, x1, self.y - self.width / 2 + self.wall, self.y + self.width / 2 - self.wall)

    @property
    def handle(self) -> Vec:
        return (self.front_x - self.open - self.handle_out, self.y, self.handle_z)

    @property
    def position(self) -> Vec:
        """The centre of the drawer's floor (moves with the drawer)."""
        return (self.front_x - self.open + self.depth / 2, self.y, self.floor_z)


@dataclass(frozen=True)
class Skill:
    """One parsed primitive: ``name`` in pick/place/push and its coordinates (mm)."""

    name: str
    args: tuple[float, ...]

    def __post_init__(self) -> None:
        if SKILL_ARITY.get(self.name) != len(self.args):
            raise ValueError(f"{self.name} takes {SKILL_ARITY.get(self.name)} coordinates, got {len(self.args)}")

    def text(self) -> str:
        """The canonical action string, e.g. ``pick(52, -80, 20)``."""
        return f"{self.name}({', '.join(fmt_num(v) for v in self.args)})"


@dataclass(frozen=True)
class SkillResult:
    """``ok``: the skill ran; ``message``: what happened or why it failed; ``changed``: the scene changed."""

    ok: bool
    message: str
    changed: bool = False


# ---------------------------------------------------------------------------------------------
# Geometry (pure)
# ---------------------------------------------------------------------------------------------

def overlap(a: Rect, b: Rect) -> bool:
    """The rectangles share an area (touching edges do not count)."""
    return a[0] < b[1] - _EPS and b[0] < a[1] - _EPS and a[2] < b[3] - _EPS and b[2] < a[3] - _EPS


def inside(a: Rect, b: Rect) -> bool:
    """``a`` lies within ``b``."""
    return a[0] >= b[0] - _EPS and a[1] <= b[1] + _EPS and a[2] >= b[2] - _EPS and a[3] <= b[3] + _EPS


def shift(r: Rect, dx: float, dy: float) -> Rect:
    return (r[0] + dx, r[1] + dx, r[2] + dy, r[3] + dy)


def ray_entry(x: float, y: float, dx: float, dy: float, r: Rect) -> float | None:
    """Smallest t in [0, 1] where the point (x, y) + t (dx, dy) enters rectangle ``r`` (slab
    method); None if the segment misses it or starts inside it."""
    if r[0] < x < r[1] and r[2] < y < r[3]:
        return None
    t0, t1 = 0.0, 1.0
    for p, d, lo, hi in ((x, dx, r[0], r[1]), (y, dy, r[2], r[3])):
        if abs(d) < _EPS:
            if not lo - _EPS <= p <= hi + _EPS:
                return None
            continue
        a, b = (lo - p) / d, (hi - p) / d
        if a > b:
            a, b = b, a
        t0, t1 = max(t0, a), min(t1, b)
        if t0 > t1 + _EPS:
            return None
    return t0


def dist_xy(a: Sequence[float], b: Sequence[float]) -> float:
    return math.hypot(a[0] - b[0], a[1] - b[1])


__all__ = ["TABLE", "DRAWER", "GRIPPER", "SKILL_ARITY", "Vec", "Rect", "fmt_num", "fmt_point", "Bounds", "Tolerances",
           "Body", "Target", "Drawer", "Skill", "SkillResult", "overlap", "inside", "shift", "ray_entry", "dist_xy"]
