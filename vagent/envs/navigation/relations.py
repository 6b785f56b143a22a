"""Egocentric geometry of the navigation env: headings, an object's place relative to the agent in
the judge's words, distances to footprints and the success test.

Egocentric relations (the judge's vocabulary): for a point ``p`` and the agent at ``a`` with
forward unit ``f`` and right unit ``r``, ``forward = (p - a) . f``, ``lateral = (p - a) . r`` and
the bearing ``theta = atan2(lateral, forward)`` in degrees (0 ahead, +90 right). The bearing of an
object's centre is cut into 8 sectors of 45 degrees: ``|theta| < 22.5`` -> ``(ahead, same)``,
``22.5 < theta < 67.5`` -> ``(ahead, right)``, ``67.5 < theta < 112.5`` -> ``(same, right)``,
``112.5 < theta < 157.5`` -> ``(behind, right)``, ``|theta| > 157.5`` -> ``(behind, same)`` and
mirrored for left. The 4-way ``direction`` (VAGEN's ahead/left/right/back) uses 90-degree
sectors: ``|theta| <= 45`` ahead, ``45 < theta <= 135`` right, ``-135 <= theta < -45`` left, else
back. An object's ``distance`` is from the agent to the closest point of its footprint (0 inside).

Coordinates as in :mod:`vagent.envs.navigation.world` (metres, ``x`` east, ``z`` north; yaw 0
faces north, 90 east). Pure functions.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from vagent.envs.navigation.layout import Furniture, Pose, Room


def heading(yaw: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """(forward, right) unit vectors in grid steps ``(dx, dz)`` for a yaw multiple of 90."""
    fwd = {0: (0, 1), 90: (1, 0), 180: (0, -1), 270: (-1, 0)}[yaw % 360]
    return fwd, (fwd[1], -fwd[0])


def egocentric(agent_xz: Sequence[float], yaw_deg: float, point_xz: Sequence[float]) -> tuple[float, float]:
    """(forward, lateral) of ``point`` in the agent frame (metres; lateral > 0 is to the right)."""
    dx, dz = point_xz[0] - agent_xz[0], point_xz[1] - agent_xz[1]
    s, c = math.sin(math.radians(yaw_deg)), math.cos(math.radians(yaw_deg))
    return dx * s + dz * c, dx * c - dz * s


def bearing(forward: float, lateral: float) -> float:
    """Degrees in (-180, 180]: 0 ahead, +90 right, -90 left, 180 behind."""
    return math.degrees(math.atan2(lateral, forward))


def relation_words(theta: float) -> tuple[str, str]:
    """(vertical, horizontal) judge words of a bearing: 8 sectors of 45 degrees (module docstring)."""
    a = abs(theta)
    vertical = "ahead" if a < 67.5 else "behind" if a > 112.5 else "same"
    horizontal = "same" if a < 22.5 or a > 157.5 else ("right" if theta > 0 else "left")
    return vertical, horizontal


def direction4(theta: float) -> str:
    """VAGEN's coarse direction: ahead / right / left / back (90-degree sectors)."""
    if abs(theta) <= 45.0:
        return "ahead"
    if 45.0 < theta <= 135.0:
        return "right"
    if -135.0 <= theta < -45.0:
        return "left"
    return "back"


def box_distance(x: float, z: float, box: Sequence[float]) -> float:
    """Distance from (x, z) to the closest point of the box ``(x0, z0, x1, z1)`` (0 inside)."""
    x0, z0, x1, z1 = box
    dx = max(x0 - x, 0.0, x - x1)
    dz = max(z0 - z, 0.0, z - z1)
    return math.hypot(dx, dz)


def object_box(obj: Furniture, cell: float) -> tuple[float, float, float, float]:
    return obj.x0 * cell, obj.z0 * cell, obj.x1 * cell, obj.z1 * cell


def object_center(obj: Furniture, cell: float) -> tuple[float, float]:
    return (obj.x0 + obj.x1) * cell / 2.0, (obj.z0 + obj.z1) * cell / 2.0


def object_relation(room: Room, pose: Pose, obj: Furniture) -> dict[str, Any]:
    """``{"object", "color", "direction", "vertical", "horizontal", "distance"}`` of ``obj`` from ``pose``."""
    agent = pose.position(room.cell)
    fwd, lat = egocentric(agent, pose.yaw, object_center(obj, room.cell))
    theta = bearing(fwd, lat)
    v, h = relation_words(theta)
    return {"object": obj.name, "color": obj.color, "direction": direction4(theta), "vertical": v,
            "horizontal": h, "distance": round(box_distance(*agent, object_box(obj, room.cell)), 2),
            "bearing": round(theta, 1)}


def target_distance(room: Room, pose: Pose, target: int) -> float:
    return box_distance(*pose.position(room.cell), object_box(room.objects[target], room.cell))


def is_success(room: Room, pose: Pose, target: int, success_distance: float, require_facing: bool,
               fov: float) -> bool:
    """Within ``success_distance`` metres of the target's footprint (and, if ``require_facing``,
    the target's centre is inside the horizontal field of view: ``|bearing| <= fov / 2``)."""
    if target_distance(room, pose, target) > success_distance + 1e-9:
        return False
    if not require_facing:
        return True
    obj = room.objects[target]
    fwd, lat = egocentric(pose.position(room.cell), pose.yaw, object_center(obj, room.cell))
    return abs(bearing(fwd, lat)) <= fov / 2.0 + 1e-9


__all__ = ["heading", "egocentric", "bearing", "relation_words", "direction4", "box_distance", "object_box",
           "object_center", "object_relation", "target_distance", "is_success"]
