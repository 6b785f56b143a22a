"""Egocentric renderer of a navigation room: a column raycaster in numpy (no GPU, no downloads).

Camera: a pinhole at height ``CAMERA_HEIGHT`` (1.5 m) at the agent's cell centre, looking along
the yaw, horizontal field of view ``fov``, square pixels (focal length ``F = W / 2 / tan(fov / 2)``
pixels). Pitch is a vertical shear (Build-engine style, exact for vertical edges, approximate
for the perspective of looking up or down): the horizon row is ``y_h = H / 2 - F tan(pitch)``
(pitch > 0 looks down, so the horizon rises). A point at height ``h`` and perpendicular distance
``d`` metres projects to row ``y = y_h + F (CAMERA_HEIGHT - h) / d``.

Per image column ``i`` a ray leaves with direction ``forward + right * c_i``,
``c_i = (2 (i + 0.5) / W - 1) tan(fov / 2)``; its forward component is 1, so the ray parameter
of a DDA step (Wolfenstein-style grid traversal, all columns at once in numpy) is the
perpendicular distance (no fish-eye). Walls are full-height cells; furniture objects are boxes
of whole cells with their own height. Drawing, back to front:

1. ceiling (flat), floor (floor-cast 0.5 m two-tone wooden tiles), and the wall slab of each
   column, coloured by the compass direction the wall faces you from (looking north you see the
   ``north`` colour: blue-grey; east: sand; south: sage; west: rose), with a dark baseboard below
   10 cm;
2. every furniture cell a ray crosses, far to near (painter's order per column): its near face
   from the floor up to its height at the entry distance ``d0``, and, when the camera is above
   the object, its top surface between the top edge at the exit distance ``d1`` and at ``d0``.
   Faces crossed along x are shaded x0.8, tops x1.15.

Every colour is multiplied by a distance fog ``1 / (1 + FOG d)``. Besides the RGB image the
renderer returns an id buffer (object index per pixel, -1 elsewhere): the env's ``state()``
lists the objects that are actually visible in the image from it.

Speed: see ``bench/navigation.py`` and docs/envs_navigation.md (about 1-2 ms per 96 px frame).

:class:`RaycastWorld` (the procedural :class:`~vagent.envs.navigation.world.NavBackend`: a generated
room, the agent pose and this renderer) is defined at the end.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from PIL import Image

from vagent.envs.navigation.world import (
    COLORS, COMPASS, WALL, Pose, Room, RoomParams, apply_action, egocentric_map, free_ahead, generate_room, is_success,
    object_relation, plan_path, target_distance,
)

CAMERA_HEIGHT = 1.5
CEILING_HEIGHT = 2.5
FOG = 0.08
BASEBOARD = 0.1
#: wall colours by the compass direction you look at them (the face seen when facing that way)
WALL_COLORS = {"north": (150, 175, 210), "east": (215, 200, 140), "south": (160, 200, 160), "west": (215, 165, 170)}
CEILING_COLOR = (232, 232, 226)
FLOOR_COLORS = ((176, 136, 96), (150, 112, 78))
FLOOR_TILE = 0.5

_WALL_RGB = np.array([WALL_COLORS[k] for k in ("east", "west", "north", "south")], dtype=np.float32)


def fog(d: np.ndarray | float) -> np.ndarray | float:
    """Distance attenuation of a colour: ``1 / (1 + FOG d)`` (d in metres)."""
    return 1.0 / (1.0 + FOG * d)


def focal_length(size: int, fov: float) -> float:
    """Pixels: ``size / 2 / tan(fov / 2)``."""
    return size / 2.0 / math.tan(math.radians(fov) / 2.0)


def horizon_row(size: int, fov: float, pitch: float) -> float:
    """Row of the horizon: ``size / 2 - F tan(pitch)`` (pitch > 0 looks down)."""
    return size / 2.0 - focal_length(size, fov) * math.tan(math.radians(pitch))


def _cast(room: Room, pose: Pose, size: int, fov: float):
    """DDA of all columns at once: per step s and column i the cell value entered ``V[s, i]``
    (-1 after the ray hit a wall), its entry parameter ``T[s, i]`` (cells, = perpendicular
    distance) and whether the crossed boundary was an x boundary ``X[s, i]``."""
    cell = room.cell
    px, pz = pose.position(cell)
    px, pz = px / cell, pz / cell
    s, c = math.sin(math.radians(pose.yaw)), math.cos(math.radians(pose.yaw))
    fwd, right = np.array([s, c]), np.array([c, -s])
    cam = (2.0 * (np.arange(size) + 0.5) / size - 1.0) * math.tan(math.radians(fov) / 2.0)
    dirs = fwd[None, :] + right[None, :] * cam[:, None]
    dirs[np.abs(dirs) < 1e-12] = 0.0
    dx, dz = dirs[:, 0], dirs[:, 1]
    mx = np.full(size, int(math.floor(px)))
    mz = np.full(size, int(math.floor(pz)))
    with np.errstate(divide="ignore"):
        ddx = np.where(dx == 0, np.inf, np.abs(1.0 / np.where(dx == 0, 1.0, dx)))
        ddz = np.where(dz == 0, np.inf, np.abs(1.0 / np.where(dz == 0, 1.0, dz)))
    sx = np.where(dx < 0, -1, 1)
    sz = np.where(dz < 0, -1, 1)
    sdx = np.where(dx == 0, np.inf, np.where(dx < 0, (px - mx) * ddx, (mx + 1 - px) * ddx))
    sdz = np.where(dz == 0, np.inf, np.where(dz < 0, (pz - mz) * ddz, (mz + 1 - pz) * ddz))
    grid = room.grid
    nz, nx = grid.shape
    active = np.ones(size, dtype=bool)
    vs, ts, xs = [], [], []
    for _ in range(nx + nz + 2):
        xside = sdx < sdz
        t = np.where(xside, sdx, sdz)
        mx = np.where(xside & active, mx + sx, mx)
        mz = np.where(~xside & active, mz + sz, mz)
        sdx = np.where(xside, sdx + ddx, sdx)
        sdz = np.where(xside, sdz, sdz + ddz)
        v = np.where(active, grid[np.clip(mz, 0, nz - 1), np.clip(mx, 0, nx - 1)], -1)
        vs.append(v)
        ts.append(t)
        xs.append(xside)
        active &= v != WALL
        if not active.any():
            break
    return np.array(vs), np.array(ts), np.array(xs), sx, sz, dirs


def _object_runs(V: np.ndarray, T: np.ndarray, X: np.ndarray):
    """The furniture runs of every column: a ray crosses an object (a convex box) in one run of
    consecutive cells. Returns (column, object, entry t, exit t, entry on an x boundary, layer)
    per run, ``layer`` 0 = nearest run of its column; None when no ray crosses furniture."""
    obj = V >= 2
    if not obj.any():
        return None
    prev = np.vstack([np.full((1, V.shape[1]), -1), V[:-1]])
    nxt = np.vstack([V[1:], np.full((1, V.shape[1]), -1)])
    sc, ss = np.nonzero((obj & (V != prev)).T)                 # run starts, by column then step
    _, se = np.nonzero((obj & (V != nxt)).T)                   # run ends, same order
    k = V[ss, sc] - 2
    first = np.searchsorted(sc, sc)                            # index of each column's first run
    layer = np.arange(len(sc)) - first
    return sc, k, T[ss, sc], T[se + 1, sc], X[ss, sc], layer


def render(room: Room, pose: Pose, size: int = 96, fov: float = 90.0) -> tuple[np.ndarray, np.ndarray]:
    """(rgb uint8 [size, size, 3], ids int16 [size, size]) of the agent's view (module docstring)."""
    V, T, X, sx, sz, dirs = _cast(room, pose, size, fov)
    cell, H, W = room.cell, size, size
    f = focal_length(size, fov)
    yh = horizon_row(size, fov, pose.pitch)
    Y = np.arange(H, dtype=np.float64)[:, None] + 0.5  # pixel-centre rows, [H, 1]
    cols = np.arange(W)

    # -- walls, floor, ceiling ---------------------------------------------------------------
    hit = np.argmax(V == WALL, axis=0)                              # [W] step of the wall hit
    dw = T[hit, cols] * cell                                         # [W] perpendicular metres
    xw = X[hit, cols]
    face = np.where(xw, np.where(sx > 0, 0, 1), np.where(sz > 0, 2, 3))  # east, west, north, south
    wall_rgb = _WALL_RGB[face] * fog(dw)[:, None]                   # [W, 3]
    top = yh + f * (CAMERA_HEIGHT - CEILING_HEIGHT) / dw             # [W]
    bottom = yh + f * CAMERA_HEIGHT / dw
    img = np.empty((H, W, 3), dtype=np.float32)
    img[:] = np.array(CEILING_COLOR, dtype=np.float32)
    below = (Y > yh)[:, 0]
    if below.any():  # floor cast: the floor point seen by each pixel below the horizon
        yb = Y[below]                                               # [Hb, 1]
        d = f * CAMERA_HEIGHT / (yb - yh)                           # [Hb, 1] metres
        px, pz = pose.position(cell)
        wx = px + d * dirs[None, :, 0]
        wz = pz + d * dirs[None, :, 1]
        parity = (np.floor(wx / FLOOR_TILE) + np.floor(wz / FLOOR_TILE)) % 2
        floor = np.where(parity[..., None] > 0, np.float32(FLOOR_COLORS[1]), np.float32(FLOOR_COLORS[0]))
        img[below] = floor * fog(d)[..., None]
    wall_mask = (Y >= top) & (Y < bottom)                            # [H, W]
    height = CAMERA_HEIGHT - (Y - yh) * dw / f                        # [H, W] world height on the wall
    shade = np.where(height < BASEBOARD, 0.55, 1.0)[..., None]
    img = np.where(wall_mask[..., None], wall_rgb[None] * shade, img)
    ids = np.full((H, W), -1, dtype=np.int16)

    # -- furniture, far to near ------------------------------------------------------------
    if room.objects:
        runs = _object_runs(V, T, X)
        if runs is not None:
            rc, k, d0, d1, xside, layer = runs
            d0, d1 = d0 * cell, d1 * cell
            h = np.array([o.height for o in room.objects])[k]
            ytop0 = yh + f * (CAMERA_HEIGHT - h) / d0                # [R] top edge at the entry
            ytop1 = yh + f * (CAMERA_HEIGHT - h) / d1                # [R] top edge at the exit
            ybot = yh + f * CAMERA_HEIGHT / d0                       # [R] floor line at the entry
            base = np.array([COLORS[o.color] for o in room.objects], dtype=np.float32)[k] * fog(d0)[:, None]
            table = np.concatenate([np.minimum(base * 1.15, 255.0),            # code 2r: top of run r
                                    base * np.where(xside, 0.8, 1.0)[:, None]])  # code R + r: its face
            n_runs = len(k)
            code = np.full((H, W), -1, dtype=np.int32)
            for j in range(int(layer.max()), -1, -1):            # far layers first (painter's order)
                r = np.nonzero(layer == j)[0]
                c = rc[r]
                m_top = (Y >= ytop1[r]) & (Y < ytop0[r])              # [H, n]
                m_face = (Y >= ytop0[r]) & (Y < ybot[r])
                code[:, c] = np.where(m_face, n_runs + r, np.where(m_top, r, code[:, c]))
            painted = code >= 0
            img[painted] = table[code[painted]]
            ids[painted] = k[code[painted] % n_runs]
    return np.clip(img + 0.5, 0, 255).astype(np.uint8), ids


# ---------------------------------------------------------------------------------------------
# The procedural backend (NavBackend) on this renderer
# ---------------------------------------------------------------------------------------------

@dataclass
class RaycastWorld:
    """The procedural backend: a generated room, the agent pose and the raycast renderer."""

    params: RoomParams
    image_size: int = 96
    max_visible: int = 5
    room: Room | None = None
    target: int = 0
    pose: Pose | None = None
    _cache: dict = field(default_factory=dict, repr=False)

    def reset(self, seed: int) -> None:
        self.room, self.target, self.pose = generate_room(np.random.default_rng(seed), self.params)
        self._cache = {}

    def set_scene(self, room: Room, target: int, pose: Pose) -> None:
        """Use a given room (tests, examples) instead of a generated one."""
        self.room, self.target, self.pose, self._cache = room, target, pose, {}

    def apply(self, action: str) -> bool:
        new = apply_action(self.room, self.pose, action)
        moved, self.pose = new != self.pose, new
        return moved

    def _render(self) -> tuple[np.ndarray, np.ndarray]:
        if self._cache.get("pose") != self.pose:
            rgb, ids = render(self.room, self.pose, self.image_size, self.params.fov)
            self._cache = {"pose": self.pose, "rgb": rgb, "ids": ids}
        return self._cache["rgb"], self._cache["ids"]

    def frame(self) -> Image.Image:
        return Image.fromarray(self._render()[0], "RGB")

    def visible_objects(self) -> list[int]:
        """Indices of the objects shown in the image (at least ``max(1, size^2 // 2000)`` pixels)."""
        ids = self._render()[1]
        counts = np.bincount(ids[ids >= 0].ravel(), minlength=len(self.room.objects))
        min_px = max(1, self.image_size * self.image_size // 2000)
        return [k for k in range(len(self.room.objects)) if counts[k] >= min_px]

    def observe(self) -> dict[str, Any]:
        room, pose = self.room, self.pose
        x, z = pose.position(room.cell)
        visible = self.visible_objects()
        target = object_relation(room, pose, room.objects[self.target])
        target["visible"] = self.target in visible
        seen = sorted((object_relation(room, pose, room.objects[k]) | {"is_target": k == self.target}
                       for k in visible), key=lambda r: (r["distance"], r["object"]))[: self.max_visible]
        relations = [_rel(target)] + [_rel(r) for r in seen if not r["is_target"]]
        return {
            "instruction": f"navigate to the {room.objects[self.target].label}",
            "agent": {"x": round(x, 3), "z": round(z, 3), "yaw": pose.yaw, "pitch": pose.pitch,
                      "facing": COMPASS[pose.yaw]},
            "target": target,
            "visible_objects": seen,
            "obstacle_ahead": self.obstacle_ahead(),
            "relations": relations,
            "success": self.success(),
            "map": egocentric_map(room, pose),
        }

    def obstacle_ahead(self) -> float:
        """Metres from the agent to the first wall or object straight ahead (its near face)."""
        n = free_ahead(self.room.grid, self.pose.ix, self.pose.iz, self.pose.yaw)
        return round((n + 0.5) * self.room.cell, 2)

    def success(self) -> bool:
        p = self.params
        return is_success(self.room, self.pose, self.target, p.success_distance, p.require_facing, p.fov)

    def target_distance(self) -> float:
        return round(target_distance(self.room, self.pose, self.target), 3)

    def plan(self) -> list[str] | None:
        p = self.params
        return plan_path(self.room, self.pose, self.target, p.success_distance, p.require_facing, p.fov)

    def close(self) -> None:
        self._cache = {}


def _rel(r: dict[str, Any]) -> dict[str, str]:
    return {"object": r["object"], "vertical": r["vertical"], "horizontal": r["horizontal"]}
