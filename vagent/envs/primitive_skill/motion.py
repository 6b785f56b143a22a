"""Motion planning of the Panda for the ManiSkill backend (:mod:`vagent.envs.primitive_skill.maniskill`).

A skill is a list of :class:`Leg` (straight moves of the gripper's centre, the TCP);
:func:`plan_legs` turns them into joint paths: waypoints ``step`` apart along each line, each
solved by inverse kinematics (SAPIEN's Pinocchio model, :class:`ArmModel`) from the previous
solution, with a turn of the wrist in 0.1 rad steps where a leg's closing direction changes. The
whole plan is solved before the arm moves; a missing IK solution or a joint jump of more than
0.25 rad between waypoints is reported as a string and nothing moves. Poses point the gripper
down (:func:`down_quat`). SAPIEN is imported only when a pose is built.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from vagent.envs.primitive_skill.objects import fmt_point

_MAX_JOINT_JUMP = 0.25


def yaw_of(q: np.ndarray) -> float:
    """Rotation about z (rad) of a wxyz quaternion."""
    w, x, y, z = (float(v) for v in q)
    return math.atan2(2 * (w * z + x * y), 1 - 2 * (y * y + z * z))


def down_quat(closing_yaw: float) -> np.ndarray:
    """wxyz quaternion of a gripper pointing down whose fingers close along the horizontal
    direction at ``closing_yaw`` (ManiSkill's ``build_grasp_pose`` frame: z approach, y closing)."""
    approach = np.array([0.0, 0.0, -1.0])
    closing = np.array([math.cos(closing_yaw), math.sin(closing_yaw), 0.0])
    ortho = np.cross(closing, approach)
    rot = np.stack([ortho, closing, approach], axis=1)
    # rotation matrix -> quaternion (wxyz); rot is proper (det 1)
    t = np.trace(rot)
    if t > 0:
        s = math.sqrt(t + 1.0) * 2
        q = [0.25 * s, (rot[2, 1] - rot[1, 2]) / s, (rot[0, 2] - rot[2, 0]) / s, (rot[1, 0] - rot[0, 1]) / s]
    else:
        i = int(np.argmax(np.diag(rot)))
        j, k = (i + 1) % 3, (i + 2) % 3
        s = math.sqrt(1.0 + rot[i, i] - rot[j, j] - rot[k, k]) * 2
        q = [0.0, 0.0, 0.0, 0.0]
        q[0] = (rot[k, j] - rot[j, k]) / s
        q[1 + i] = 0.25 * s
        q[1 + j] = (rot[j, i] + rot[i, j]) / s
        q[1 + k] = (rot[k, i] + rot[i, k]) / s
    out = np.array(q)
    return out / np.linalg.norm(out)


def grasp_yaw(centre: tuple[float, float], cube_yaw: float, others: list[tuple[float, float]]) -> float:
    """The closing direction (rad) for a cube at ``centre``: one of its two horizontal axes (the
    one nearest the world y axis on a tie), the one with the most room for the fingers, i.e. the
    largest distance along it to another object that lies within 45 mm of the closing line."""
    best, best_room = 0.0, -1.0
    base = cube_yaw % (math.pi / 2)
    for cand in sorted((base, base + math.pi / 2), key=lambda a: -abs(math.sin(a))):  # nearest to y first
        d = np.array([math.cos(cand), math.sin(cand)])
        room = math.inf
        for o in others:
            rel = np.array(o) - np.array(centre)
            along, across = abs(float(rel @ d)), abs(float(rel[0] * d[1] - rel[1] * d[0]))
            if across < 45.0:
                room = min(room, along)
        if room > best_room + 1e-6:
            best, best_room = cand, room
    # the Panda's wrist turns least when closing along world y (yaw pi/2 or -pi/2)
    return best if math.cos(best - math.pi / 2) >= 0 else best + math.pi


class Leg(NamedTuple):
    """One straight move of the gripper's centre (TCP) in a skill's plan."""

    #: where the TCP goes (world frame, metres)
    target: tuple[float, float, float]
    #: horizontal direction (rad) along which the fingers close, gripper pointing down
    yaw: float
    #: distance (m) between IK waypoints
    step: float
    #: gripper action once there (GRIPPER_OPEN / GRIPPER_CLOSED), None = unchanged
    gripper: float | None = None


@dataclass(frozen=True)
class ArmModel:
    """What inverse kinematics needs of the robot, read once when the backend starts."""

    #: SAPIEN's Pinocchio model of the articulation
    pmodel: Any
    #: index of the ``panda_hand_tcp`` link
    ee_index: int
    #: the robot's root pose in the world (IK works in the root frame)
    root_pose: Any
    #: which active joints IK moves (the 7 arm joints, not the fingers)
    arm_mask: np.ndarray
    #: joint limits, one (low, high) row per active joint
    qlimits: np.ndarray


def pose_m(p: tuple[float, ...], yaw: float) -> Any:
    """A SAPIEN pose at ``p`` (metres), gripper pointing down, fingers closing along ``yaw``."""
    import sapien

    return sapien.Pose(p=[float(v) for v in p], q=down_quat(yaw))


def solve_ik(arm: ArmModel, pose_world: Any, q_seed: np.ndarray) -> np.ndarray | None:
    """Joint positions that put the TCP at ``pose_world``, searched from ``q_seed``; None when
    IK fails or the solution leaves an arm joint's limits."""
    local = arm.root_pose.inv() * pose_world
    q, ok, _err = arm.pmodel.compute_inverse_kinematics(
        arm.ee_index, local, initial_qpos=q_seed, active_qmask=arm.arm_mask, max_iterations=200)
    q = np.asarray(q, dtype=np.float64)
    lo, hi = arm.qlimits[:, 0], arm.qlimits[:, 1]
    if not ok or np.any(((q < lo - 1e-4) | (q > hi + 1e-4))[arm.arm_mask]):
        return None
    return q


def line_path(arm: ArmModel, q: np.ndarray, a: tuple[float, ...], b: tuple[float, ...], yaw: float,
              step: float) -> list[np.ndarray] | str:
    """Joint positions along the straight segment a -> b (metres) at ``yaw``, or why none."""
    n = max(1, math.ceil(math.dist(a, b) / step))
    out = []
    for k in range(1, n + 1):
        t = k / n
        p = tuple(a[i] + t * (b[i] - a[i]) for i in range(3))
        sol = solve_ik(arm, pose_m(p, yaw), q)
        if sol is None:
            return f"no inverse-kinematics solution at {fmt_point([v * 1000 for v in p])}"
        if np.max(np.abs(sol[arm.arm_mask] - q[arm.arm_mask])) > _MAX_JOINT_JUMP:
            return f"the arm would have to jump near {fmt_point([v * 1000 for v in p])}"
        out.append(sol)
        q = sol
    return out


def turn_path(arm: ArmModel, q: np.ndarray, pos, yaw0: float, yaw1: float) -> list[np.ndarray] | str:
    """Joint positions turning the gripper at ``pos`` from ``yaw0`` to ``yaw1`` (the shorter way,
    0.1 rad steps), or why none."""
    delta = math.remainder(yaw1 - yaw0, 2 * math.pi)
    if abs(delta) < 1e-6:
        return []
    n = max(1, math.ceil(abs(delta) / 0.1))
    out = []
    for k in range(1, n + 1):
        sol = solve_ik(arm, pose_m(pos, yaw0 + delta * k / n), q)
        if sol is None:
            return f"no inverse-kinematics solution turning the gripper at {fmt_point([v * 1000 for v in pos])}"
        out.append(sol)
        q = sol
    return out


def plan_legs(arm: ArmModel, q: np.ndarray, pos: tuple[float, ...], yaw: float,
              legs: list[Leg]) -> list[tuple[list[np.ndarray], float | None]] | str:
    """Joint paths for ``legs`` from joint positions ``q`` (TCP at ``pos`` in metres, closing along
    ``yaw``), each with the gripper action to take after it (or None), or why there is no plan. The
    gripper is symmetric, so a leg may use ``yaw + pi`` instead (whichever the wrist's range allows,
    the nearer turn first)."""
    plan: list = []
    for target, leg_yaw, step, grip in legs:
        why = "no plan"
        for cand in sorted((leg_yaw, leg_yaw + math.pi), key=lambda c: abs(math.remainder(c - yaw, 2 * math.pi))):
            turn = turn_path(arm, q, pos, yaw, cand)
            if isinstance(turn, str):
                why = turn
                continue
            path = line_path(arm, turn[-1] if turn else q, pos, target, cand, step)
            if isinstance(path, str):
                why = path
                continue
            if turn:
                plan.append((turn, None))
            plan.append((path, grip))
            q, pos, yaw = path[-1], target, cand
            break
        else:
            return why
    return plan


__all__ = ["yaw_of", "down_quat", "grasp_yaw", "Leg", "ArmModel", "pose_m", "solve_ik", "line_path", "turn_path",
           "plan_legs"]
