"""Procedural rooms for the navigation env: floor plan, furniture, agent pose, dynamics, BFS planner.

Coordinates follow AI2-THOR: metres, ``x`` east, ``z`` north, ``y`` up; yaw 0 faces +z (north),
yaw 90 faces +x (east), ``rotateright`` adds 90. The floor is a grid of ``cell`` x ``cell``
squares; grid index ``[iz, ix]`` covers ``[ix*cell, (ix+1)*cell) x [iz*cell, (iz+1)*cell)``. The
agent stands at a cell centre; every move is one cell, so the reachable poses are
``(ix, iz, yaw in {0, 90, 180, 270}, pitch in {-30, 0, 30, 60})`` (pitch positive = looking down,
as AI2-THOR's camera horizon).

Grid values: ``FLOOR`` 0, ``WALL`` 1, ``k + 2`` = furniture object ``k`` (an axis-aligned box
of whole cells). Walls and furniture block movement.

The furniture types and colours are in ``catalog.py``; the egocentric relations (the judge's
vocabulary: an object's bearing cut into 8 sectors of 45 degrees, VAGEN's 4-way direction, the
distance to its footprint) and the success test in ``relations.py``; the records ``Furniture``,
``Room`` and ``Pose`` in ``layout.py``. Their names are importable from here too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Protocol, Sequence

import numpy as np
from PIL import Image

from vagent.envs.grid import bfs_actions
from vagent.envs.navigation.catalog import (  # noqa: F401 - re-exported
    CATALOG, CATALOG_BY_NAME, COLORS, LEGEND, FurnitureType,
)
from vagent.envs.navigation.layout import Furniture, Pose, Room  # noqa: F401 - re-exported
from vagent.envs.navigation.relations import (  # noqa: F401 - re-exported
    bearing, box_distance, direction4, egocentric, heading, is_success, object_box, object_center, object_relation,
    relation_words, target_distance,
)

FLOOR, WALL = 0, 1
#: canonical action names (VAGEN's navigation names); the BFS tries moves in this order
ACTIONS = ("moveahead", "moveback", "moveright", "moveleft", "rotateright", "rotateleft", "lookup", "lookdown")
_PLAN_ORDER = ("moveahead", "rotateleft", "rotateright", "moveleft", "moveright", "moveback")
PITCH_STEP = 30
PITCH_MIN, PITCH_MAX = -30, 60  # AI2-THOR's camera horizon limits (up 30, down 60)
YAWS = (0, 90, 180, 270)
COMPASS = {0: "north", 90: "east", 180: "south", 270: "west"}


@dataclass(frozen=True)
class RoomParams:
    """What ``generate_room`` needs (taken from the env config)."""

    cell: float = 0.25
    room_size: tuple[float, float] = (3.0, 5.0)
    num_objects: int = 6
    partition_prob: float = 0.5
    min_start_distance: float = 1.5
    success_distance: float = 1.0
    require_facing: bool = False
    fov: float = 90.0


class GenerationError(RuntimeError):
    """No room satisfying the parameters was found in the allowed attempts."""


# ---------------------------------------------------------------------------------------------
# Dynamics and planning
# ---------------------------------------------------------------------------------------------

def apply_action(room: Room, pose: Pose, action: str) -> Pose:
    """The pose after ``action`` (a canonical name); a blocked move or a look past the limit
    returns ``pose`` unchanged."""
    if action in ("rotateright", "rotateleft"):
        return Pose(pose.ix, pose.iz, (pose.yaw + (90 if action == "rotateright" else -90)) % 360, pose.pitch)
    if action in ("lookup", "lookdown"):
        pitch = pose.pitch + (PITCH_STEP if action == "lookdown" else -PITCH_STEP)
        return pose if not PITCH_MIN <= pitch <= PITCH_MAX else Pose(pose.ix, pose.iz, pose.yaw, pitch)
    fwd, right = heading(pose.yaw)
    d = {"moveahead": fwd, "moveback": (-fwd[0], -fwd[1]), "moveright": right,
         "moveleft": (-right[0], -right[1])}.get(action)
    if d is None:
        raise ValueError(f"unknown navigation action {action!r}; valid: {', '.join(ACTIONS)}")
    ix, iz = pose.ix + d[0], pose.iz + d[1]
    nz, nx = room.shape
    if not (0 <= ix < nx and 0 <= iz < nz) or room.grid[iz, ix] != FLOOR:
        return pose
    return Pose(ix, iz, pose.yaw, pose.pitch)


def plan_path(room: Room, pose: Pose, target: int, success_distance: float, require_facing: bool,
              fov: float) -> list[str] | None:
    """BFS over (cell, yaw) for the fewest actions to a success pose ([] if already there, None if
    unreachable). Moves are tried in the order moveahead, rotateleft, rotateright, moveleft,
    moveright, moveback, so the plan is deterministic. Pitch is kept (success ignores it)."""
    if is_success(room, pose, target, success_distance, require_facing, fov):
        return []

    def moves(key: tuple[int, int, int]) -> Iterator[tuple[str, tuple[int, int, int]]]:
        here = Pose(key[0], key[1], key[2], pose.pitch)
        for action in _PLAN_ORDER:
            nxt = apply_action(room, here, action)
            yield action, (nxt.ix, nxt.iz, nxt.yaw)

    def arrived(key: tuple[int, int, int]) -> bool:
        return is_success(room, Pose(key[0], key[1], key[2], pose.pitch), target, success_distance, require_facing,
                          fov)

    return bfs_actions((pose.ix, pose.iz, pose.yaw), moves, arrived)


# ---------------------------------------------------------------------------------------------
# Generation
# ---------------------------------------------------------------------------------------------

def _connected(grid: np.ndarray) -> bool:
    """All FLOOR cells are 4-connected."""
    free = np.argwhere(grid == FLOOR)
    if len(free) == 0:
        return False
    seen = np.zeros(grid.shape, dtype=bool)
    stack = [tuple(free[0])]
    seen[stack[0]] = True
    count = 0
    while stack:
        z, x = stack.pop()
        count += 1
        for dz, dx in ((1, 0), (-1, 0), (0, 1), (0, -1)):
            q = (z + dz, x + dx)
            if grid[q] == FLOOR and not seen[q]:
                seen[q] = True
                stack.append(q)
    return count == len(free)


def _draw_shell(rng: np.random.Generator, p: RoomParams) -> np.ndarray:
    lo, hi = p.room_size
    nx = max(4, int(round(rng.uniform(lo, hi) / p.cell)))
    nz = max(4, int(round(rng.uniform(lo, hi) / p.cell)))
    grid = np.full((nz + 2, nx + 2), WALL, dtype=np.int16)
    grid[1:-1, 1:-1] = FLOOR
    if rng.random() < p.partition_prob:
        door = max(2, int(round(1.0 / p.cell)))
        axis = int(rng.integers(2))  # 0: a wall of constant x, 1: constant z
        n_along, n_across = (nz, nx) if axis == 0 else (nx, nz)
        if n_across >= 8 and n_along >= door + 2:
            at = 1 + int(rng.integers(int(0.35 * n_across), int(0.65 * n_across) + 1))
            gap = 1 + int(rng.integers(0, n_along - door + 1))
            if axis == 0:
                grid[1:-1, at] = WALL
                grid[gap:gap + door, at] = FLOOR
            else:
                grid[at, 1:-1] = WALL
                grid[at, gap:gap + door] = FLOOR
    return grid


def _place_objects(rng: np.random.Generator, grid: np.ndarray, p: RoomParams) -> tuple[Furniture, ...] | None:
    types = rng.choice(len(CATALOG), size=p.num_objects, replace=False)
    colors = rng.choice(len(COLORS), size=p.num_objects, replace=False)
    names = list(COLORS)
    placed: list[Furniture] = []
    nz, nx = grid.shape
    for k, (ti, ci) in enumerate(zip(types, colors)):
        t = CATALOG[int(ti)]
        w, d = max(1, round(t.width / p.cell)), max(1, round(t.depth / p.cell))
        if rng.random() < 0.5:
            w, d = d, w
        for _ in range(60):
            x0, z0 = int(rng.integers(1, nx - w)), int(rng.integers(1, nz - d))
            x1, z1 = x0 + w, z0 + d
            if not (grid[z0:z1, x0:x1] == FLOOR).all():
                continue
            ring = grid[max(z0 - 1, 0):z1 + 1, max(x0 - 1, 0):x1 + 1]
            if (ring >= 2).any():  # keep one free cell between objects
                continue
            grid[z0:z1, x0:x1] = k + 2
            placed.append(Furniture(t.name, names[int(ci)], x0, z0, x1, z1, t.height))
            break
        else:
            return None
    return tuple(placed)


def free_ahead(grid: np.ndarray, ix: int, iz: int, yaw: int) -> int:
    """Free floor cells straight ahead of cell (ix, iz) facing ``yaw`` before a wall or object."""
    (dx, dz), _ = heading(yaw)
    n = 0
    while grid[iz + dz * (n + 1), ix + dx * (n + 1)] == FLOOR:
        n += 1
    return n


def generate_room(rng: np.random.Generator, p: RoomParams, attempts: int = 200) -> tuple[Room, int, Pose]:
    """(room, target index, start pose) drawn from ``rng``: a rectangular room of side lengths in
    ``p.room_size`` metres, an optional partition wall with a 1 m doorway, ``p.num_objects``
    furniture boxes of distinct types and colours (one free cell between objects, all floor
    connected), a random target, and a start at least ``p.min_start_distance`` from it from
    which the BFS reaches a success pose, drawn uniformly among the (cell, yaw) pairs with at least
    1.5 m of free floor ahead (among all pairs if none has). Redrawn from the same RNG stream until valid."""
    for _ in range(attempts):
        grid = _draw_shell(rng, p)
        objects = _place_objects(rng, grid, p)
        if objects is None or not _connected(grid):
            continue
        room = Room(grid, objects, p.cell)
        target = int(rng.integers(len(objects)))
        box = object_box(objects[target], p.cell)
        free = [(int(z), int(x)) for z, x in np.argwhere(grid == FLOOR)]
        far = [(z, x) for z, x in free if box_distance((x + 0.5) * p.cell, (z + 0.5) * p.cell, box)
               >= p.min_start_distance]
        if not far:
            continue
        # start facing >= 1.5 m of free floor when the room has such a pose
        starts = [(x, z, y) for z, x in far for y in YAWS if free_ahead(grid, x, z, y) * p.cell >= 1.5]
        starts = starts or [(x, z, y) for z, x in far for y in YAWS]
        pose = Pose(*starts[int(rng.integers(len(starts)))], 0)
        if plan_path(room, pose, target, p.success_distance, p.require_facing, p.fov) is None:
            continue
        return room, target, pose
    raise GenerationError(
        f"no valid room in {attempts} attempts with room_size={p.room_size}, num_objects={p.num_objects}, "
        f"min_start_distance={p.min_start_distance}; use larger rooms, fewer objects or a smaller start distance"
    )


def parse_layout(rows: Sequence[str], objects: dict[str, tuple[str, str]], cell: float = 0.25) -> tuple[Room, Pose]:
    """A room from a top-down map (tests, examples): row 0 is the NORTH edge (largest z).

    Symbols: ``#`` wall, ``.`` floor, ``^ > v <`` the agent facing north/east/south/west (on
    floor), and any key of ``objects``, mapping a symbol to ``(type name, colour)``; each object
    symbol must fill one rectangle. Raises ValueError naming what is wrong.
    """
    nz = len(rows)
    if nz < 3 or len({len(r) for r in rows}) != 1:
        raise ValueError(f"layout rows must be >= 3 and of equal length; got {list(rows)}")
    nx = len(rows[0])
    grid = np.full((nz, nx), WALL, dtype=np.int16)
    cells: dict[str, list[tuple[int, int]]] = {}
    pose = None
    for r, row in enumerate(rows):
        iz = nz - 1 - r
        for ix, s in enumerate(row):
            if s == "#":
                continue
            if s in ".^>v<":
                grid[iz, ix] = FLOOR
                if s != ".":
                    if pose is not None:
                        raise ValueError("layout has more than one agent symbol (^ > v <)")
                    pose = Pose(ix, iz, {"^": 0, ">": 90, "v": 180, "<": 270}[s])
            elif s in objects:
                cells.setdefault(s, []).append((ix, iz))
            else:
                raise ValueError(f"unknown layout symbol {s!r}; expected # . ^ > v < or one of {sorted(objects)}")
    if pose is None:
        raise ValueError("layout has no agent symbol (^ > v <)")
    placed = []
    for k, (sym, pts) in enumerate(sorted(cells.items())):
        name, color = objects[sym]
        if name not in CATALOG_BY_NAME or color not in COLORS:
            raise ValueError(f"object {sym!r} = {(name, color)}: unknown type or colour")
        xs, zs = [p[0] for p in pts], [p[1] for p in pts]
        x0, x1, z0, z1 = min(xs), max(xs) + 1, min(zs), max(zs) + 1
        if (x1 - x0) * (z1 - z0) != len(pts):
            raise ValueError(f"object {sym!r} does not fill a rectangle")
        grid[z0:z1, x0:x1] = len(placed) + 2
        placed.append(Furniture(name, color, x0, z0, x1, z1, CATALOG_BY_NAME[name].height))
    return Room(grid, tuple(placed), cell), pose


def egocentric_map(room: Room, pose: Pose) -> list[str]:
    """The whole room as symbol rows (LEGEND), rotated so the agent (``^``) faces up."""
    sym = np.full(room.grid.shape, ".", dtype="<U1")
    sym[room.grid == WALL] = "#"
    for k, obj in enumerate(room.objects):
        sym[room.grid == k + 2] = CATALOG_BY_NAME[obj.name].symbol
    sym[pose.iz, pose.ix] = "^"
    north_up = sym[::-1]  # row 0 = largest z
    return ["".join(r) for r in np.rot90(north_up, k=pose.yaw // 90)]


# ---------------------------------------------------------------------------------------------
# The backend protocol (RaycastWorld in raycast.py, AI2-THOR in ai2thor_backend.py)
# ---------------------------------------------------------------------------------------------

class NavBackend(Protocol):
    """What NavigationEnv needs from a world: ``raycast.RaycastWorld`` or the AI2-THOR one."""

    def reset(self, seed: int) -> None: ...

    def apply(self, action: str) -> bool:
        """Run one canonical action; False when it changed nothing (blocked, pitch limit)."""
        ...

    def frame(self) -> Image.Image: ...

    def observe(self) -> dict[str, Any]:
        """The state dict (see NavigationEnv.state)."""
        ...

    def success(self) -> bool: ...

    def target_distance(self) -> float: ...

    def plan(self) -> list[str] | None: ...

    def close(self) -> None: ...
