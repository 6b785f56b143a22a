"""The initial scenes of PrimitiveSkill's tasks (:mod:`vagent.envs.primitive_skill.tasks`): every
builder draws the layout from the episode's ``numpy`` Generator only, so a seed gives one layout
(on both backends: the ManiSkill tabletop builds its scene with these builders too)."""

from __future__ import annotations

from typing import Callable

import numpy as np

from vagent.envs.primitive_skill.objects import Body, Bounds, Drawer, Rect, Target, Tolerances, dist_xy, overlap
from vagent.envs.primitive_skill.sim import Scene

CUBE_HALF = (20.0, 20.0, 20.0)
APPLE_HALF = (30.0, 30.0, 30.0)
COLORS = {
    "red_cube": (215, 45, 45), "green_cube": (45, 170, 70), "purple_cube": (165, 70, 205), "apple": (190, 25, 45),
}


def _cube(name: str, x: float, y: float) -> Body:
    return Body(name, "cube", COLORS[name], CUBE_HALF, (float(x), float(y), CUBE_HALF[2]))


def _sample_points(rng: np.random.Generator, n: int, xr: tuple[int, int], yr: tuple[int, int], min_dist: float,
                   ok: Callable[[list[tuple[int, int]]], bool] = lambda pts: True) -> list[tuple[int, int]]:
    """``n`` integer points in the boxes ``xr`` x ``yr`` (inclusive), pairwise at least ``min_dist``
    apart and accepted by ``ok``; redrawn from the same stream until they fit."""
    for _ in range(10_000):
        pts: list[tuple[int, int]] = []
        for _ in range(n):
            pts.append((int(rng.integers(xr[0], xr[1] + 1)), int(rng.integers(yr[0], yr[1] + 1))))
        if all(dist_xy(a, b) >= min_dist for i, a in enumerate(pts) for b in pts[i + 1:]) and ok(pts):
            return pts
    raise RuntimeError(f"could not place {n} objects in x {xr}, y {yr} at {min_dist} mm apart")


def build_align(rng: np.random.Generator, bounds: Bounds, tol: Tolerances) -> Scene:
    # near the far edge as in VAGEN, 60 mm apart in y so both fit on the line x = 0
    pts = _sample_points(rng, 2, (40, 120), (-170, 170), 60.0, lambda p: abs(p[0][1] - p[1][1]) >= 60)
    bodies = [_cube("red_cube", *pts[0]), _cube("green_cube", *pts[1])]
    return Scene({b.name: b for b in bodies}, bounds=bounds, tol=tol)


def build_place(rng: np.random.Generator, bounds: Bounds, tol: Tolerances) -> Scene:
    left = Target("left_target", int(rng.integers(60, 111)), int(rng.integers(70, 151)))
    right = Target("right_target", int(rng.integers(60, 111)), int(rng.integers(-150, -69)))
    pts = _sample_points(rng, 2, (-80, 0), (-100, 100), 60.0)
    bodies = [_cube("red_cube", *pts[0]), _cube("green_cube", *pts[1])]
    return Scene({b.name: b for b in bodies}, {t.name: t for t in (left, right)}, bounds=bounds, tol=tol)


def build_stack(rng: np.random.Generator, bounds: Bounds, tol: Tolerances) -> Scene:
    pts = _sample_points(rng, 3, (-80, 130), (-180, 180), 60.0)
    bodies = [_cube(n, *p) for n, p in zip(("red_cube", "green_cube", "purple_cube"), pts)]
    return Scene({b.name: b for b in bodies}, bounds=bounds, tol=tol)


def _grow(r: Rect, m: float) -> Rect:
    return (r[0] - m, r[1] + m, r[2] - m, r[3] + m)


def build_drawer(rng: np.random.Generator, bounds: Bounds, tol: Tolerances) -> Scene:
    drawer = Drawer(front_x=40.0, y=float(rng.integers(-110, 111)))
    keep_out = [_grow(drawer.cabinet_rect, 10), _grow(drawer.drawer_rect(drawer.max_open), 10)]

    def clear(pts: list[tuple[int, int]]) -> bool:
        fp = (pts[0][0] - 30, pts[0][0] + 30, pts[0][1] - 30, pts[0][1] + 30)
        return not any(overlap(fp, r) for r in keep_out)

    (ax, ay), = _sample_points(rng, 1, (-70, 120), (-170, 170), 0.0, clear)
    apple = Body("apple", "apple", COLORS["apple"], APPLE_HALF, (float(ax), float(ay), APPLE_HALF[2]))
    return Scene({"apple": apple}, drawer=drawer, bounds=bounds, tol=tol)


__all__ = ["CUBE_HALF", "APPLE_HALF", "COLORS", "build_align", "build_place", "build_stack", "build_drawer"]
