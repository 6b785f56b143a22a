"""The ManiSkill 3 backend of ``PrimitiveSkillEnv`` (``backend="maniskill"``): real contact physics
(PhysX on the CPU) with a Franka Panda and a rendered camera image.

The scene, the install and the availability checks are :mod:`vagent.envs.primitive_skill.tabletop`;
this module runs the skills on it.

Skills: the kinematic rules decide first, on the scene read back from the simulator (same
tolerances, same failure messages; a refused skill moves nothing). An accepted skill becomes
Cartesian waypoints for the gripper (straight lines, 10 mm apart, 5 mm while pushing), each solved
by inverse kinematics (SAPIEN's Pinocchio model) from the previous solution; the whole plan is solved
before the arm moves, so a failed plan (no IK solution, a jump in the joints) is reported as
``no motion plan: ...`` and changes nothing. The plan runs on the ``pd_joint_pos`` controller.

- ``pick``: the object the kinematic rule selects is grasped at its centre, the fingers closing
  along its horizontal axis with the most room beside it; the arm lifts it to ``TRAVEL_M`` and
  stays there. It fails (after moving) when the object is not in the gripper afterwards.
- ``place``: the held object's centre goes to the kinematic landing point (snapped onto a cube
  within ``stack_tolerance``) 3 mm above its resting height, the gripper opens, the arm returns to rest.
- ``push``: the closed gripper's leading face follows the segment at z1, then the arm returns to rest.

What the text, stages, success and the oracle see is read back from the actors: positions (mm),
what rests on what (a cube within ``stack_tolerance`` horizontally whose top is within 10 mm of the
bottom), the held object (ManiSkill's ``is_grasping``), the gripper (the TCP). Physics may differ
from the kinematic prediction (a cube may slip or tip); the outcome the text reports is the
simulated one. ``drawer`` needs ManiSkill's PartNet-Mobility cabinet and YCB apple (downloads) and
is refused at ``make()`` with the download commands. The inverse kinematics and the joint paths
are :mod:`vagent.envs.primitive_skill.motion`.
"""

from __future__ import annotations

import math
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from vagent.config import ConfigError
from vagent.envs.primitive_skill.motion import (  # noqa: F401 - re-exported: the pure geometry helpers
    ArmModel, Leg, down_quat, grasp_yaw, plan_legs, pose_m, solve_ik, yaw_of,
)
from vagent.envs.primitive_skill.sim import (
    GRIPPER, TABLE, Body, Bounds, Scene, Skill, SkillResult, Target, Tolerances, dist_xy, fmt_point,
)
from vagent.envs.primitive_skill.tabletop import drawer_refusal, import_maniskill, tabletop_env_class
from vagent.envs.primitive_skill.tasks import COLORS, CUBE_HALF, Task

#: where the gripper waits between skills (mm): behind the workspace, out of the camera's view
REST_MM = (-300.0, 0.0, 320.0)
#: height (m) of the gripper's centre when it moves over the table (clears a 3-cube stack with a held cube)
TRAVEL_M = 0.19
#: the gripper's (normalized) pd_joint_pos action: open, closed; and its finger joint when open (m)
GRIPPER_OPEN, GRIPPER_CLOSED = 1.0, -1.0
FINGER_OPEN_Q = 0.04
#: half the thickness of the closed fingers along a push (m): the leading face is this far ahead of the TCP
FINGER_HALF_M = 0.017
_STEP_M, _PUSH_STEP_M = 0.01, 0.005


# ---------------------------------------------------------------------------------------------
# The backend
# ---------------------------------------------------------------------------------------------

class ManiSkillBackend:
    """The ``Backend`` protocol of ``env.py`` on our ManiSkill tabletop with an IK-planned Panda."""

    def __init__(self, task: Task, bounds: Bounds, tol: Tolerances, image_size: int = 128) -> None:
        mani_skill = import_maniskill()
        if task.name == "drawer":
            raise ConfigError(drawer_refusal(Path(mani_skill.ASSET_DIR)))
        probe = task.build(np.random.default_rng(0), bounds, tol)
        self.task, self.bounds, self.tol = task, bounds, tol
        self.body_names = tuple(probe.bodies)
        self.target_names = tuple(probe.targets)
        try:
            import sapien

            sapien.set_log_level("off")
        except Exception:  # noqa: BLE001  (older sapien: keep its logging)
            pass
        cls = tabletop_env_class()
        self.env = cls(bodies=self.body_names, targets=self.target_names, image_size=image_size, num_envs=1,
                       obs_mode="none", reward_mode="none", control_mode="pd_joint_pos", render_mode="rgb_array",
                       sim_backend="physx_cpu", render_backend="cpu")
        self.base = self.env.unwrapped
        self.pmodel = self.robot._objs[0].create_pinocchio_model()
        self.ee_index = [link.name for link in self.robot.links].index("panda_hand_tcp")
        self.root_pose = self.robot._objs[0].get_root_pose()
        n = len(self.robot._objs[0].get_active_joints())
        self.arm_mask = np.array([1] * 7 + [0] * (n - 7), dtype=bool)
        self.qlimits = self.robot.get_qlimits()[0].cpu().numpy().astype(np.float64)
        self.arm = ArmModel(self.pmodel, self.ee_index, self.root_pose, self.arm_mask, self.qlimits)
        self.gripper = GRIPPER_OPEN
        self._rest_q: np.ndarray | None = None
        self._target_q: np.ndarray | None = None
        #: control steps (env.step of ManiSkill, 5 PhysX substeps each) run so far
        self.sim_steps = 0
        self._scene_cache: Scene | None = None

    # -- protocol ----------------------------------------------------------------------------
    def reset(self, seed: int) -> None:
        layout = self.task.build(np.random.default_rng(seed), self.bounds, self.tol)
        self.base.layout = {b.name: tuple(v / 1000.0 for v in b.pos) for b in layout.bodies.values()}
        self.base.layout.update({t.name: (t.x / 1000.0, t.y / 1000.0, 0.0) for t in layout.targets.values()})
        if self._rest_q is None:
            self.env.reset(seed=seed)
            q0 = self._qpos()
            rest = tuple(v / 1000 for v in REST_MM)
            sol = self._ik(self._pose_m(rest, math.pi / 2), q0)
            sol = sol if sol is not None else self._ik(self._pose_m(rest, -math.pi / 2), q0)
            if sol is None:
                raise RuntimeError("ManiSkill backend: no IK solution for the rest pose REST_MM")
            sol[~self.arm_mask] = FINGER_OPEN_Q
            self._rest_q = sol
            self.base.rest_qpos = sol
        # a fresh PhysX scene each episode: resetting poses alone leaves contact caches that make
        # episodes of the same seed differ in the last digits
        self.env.reset(seed=seed, options={"reconfigure": True})
        self.gripper = GRIPPER_OPEN
        self._target_q = self._rest_q
        for _ in range(5):  # let the cubes settle on the table
            self._act(self._rest_q)
        self._scene_cache = None

    def scene(self) -> Scene:
        if self._scene_cache is None:
            self._scene_cache = self._read_scene()
        return self._scene_cache

    def apply(self, skill: Skill) -> SkillResult:
        before = self.scene()
        probe = before.copy()
        verdict = probe.apply(skill)  # the kinematic rules: tolerances, reach, what is grasped, landing
        if not verdict.ok:
            return verdict
        if skill.name == "pick":
            res = self._pick(before, probe)
        elif skill.name == "place":
            res = self._place(before, skill)
        else:
            res = self._push(before, skill, probe)
        return res

    def render(self, size: int) -> Image.Image:
        frame = self.env.render()
        arr = frame[0].cpu().numpy() if hasattr(frame, "cpu") else np.asarray(frame)[0]
        img = Image.fromarray(arr[..., :3].astype("uint8")).convert("RGB")
        return img if img.size == (size, size) else img.resize((size, size), Image.BILINEAR)

    def save(self) -> tuple:
        """The simulator's state (ManiSkill's ``get_state_dict``: poses, velocities, joint
        positions) and the skill executor's own (gripper command, joint target, step count)."""
        def frozen(v: Any) -> Any:  # the tensors may be views the simulator updates in place
            return {k: frozen(x) for k, x in v.items()} if isinstance(v, dict) else v.clone() if hasattr(v, "clone") else v

        return frozen(self.base.get_state_dict()), self.gripper, self._target_q, self.sim_steps

    def restore(self, saved: tuple) -> None:
        """Put back a :meth:`save`: the bodies, the arm and the executor as they were (PhysX's
        contact caches are not part of it, so later digits of a replay may differ)."""
        state, self.gripper, self._target_q, self.sim_steps = saved
        self.base.set_state_dict(state)
        self._scene_cache = None

    def close(self) -> None:
        self.env.close()

    # -- reading the simulator ----------------------------------------------------------------
    @property
    def robot(self) -> Any:
        return self.base.agent.robot  # rebuilt by every reset

    def _qpos(self) -> np.ndarray:
        return self.robot.get_qpos()[0].cpu().numpy().astype(np.float64)

    def tcp_mm(self) -> tuple[float, float, float]:
        p = self.base.agent.tcp.pose.p[0].cpu().numpy() * 1000.0
        return (float(p[0]), float(p[1]), float(p[2]))

    def camera_params(self) -> dict[str, np.ndarray]:
        """The top camera's ``intrinsic_cv`` (3x3) and ``extrinsic_cv`` (3x4, world -> camera) for projections."""
        cam = self.base._human_render_cameras["top_camera"]
        params = cam.get_params()
        return {k: params[k][0].cpu().numpy() for k in ("intrinsic_cv", "extrinsic_cv")}

    def _read_scene(self) -> Scene:
        bodies: dict[str, Body] = {}
        held = None
        for name in self.body_names:
            actor = self.base.cubes[name]
            p = actor.pose.p[0].cpu().numpy() * 1000.0
            bodies[name] = Body(name, "cube", COLORS[name], CUBE_HALF, (float(p[0]), float(p[1]), float(p[2])))
            if self.gripper == GRIPPER_CLOSED and bool(self.base.agent.is_grasping(actor)[0]):
                held = name
        for b in bodies.values():
            if b.name == held:
                b.support = GRIPPER
                continue
            below = [o for o in bodies.values() if o is not b and o.name != held and dist_xy(o.pos, b.pos) <= self.tol.stack
                     and abs(o.top - b.bottom) <= 10.0]
            b.support = below[0].name if below else TABLE
        targets = {}
        for name in self.target_names:
            p = self.base.targets[name].pose.p[0].cpu().numpy() * 1000.0
            targets[name] = Target(name, float(p[0]), float(p[1]))
        return Scene(bodies, targets, None, self.tcp_mm(), held, self.bounds, self.tol)

    # -- planning (vagent.envs.primitive_skill.motion) ------------------------------------------
    def _pose_m(self, p: tuple[float, ...], yaw: float) -> Any:
        return pose_m(p, yaw)

    def _ik(self, pose_world: Any, q_seed: np.ndarray) -> np.ndarray | None:
        return solve_ik(self.arm, pose_world, q_seed)

    def _plan(self, legs: list[Leg]) -> list[tuple[list[np.ndarray], float | None]] | str:
        """Joint paths for ``legs`` from the current joints and TCP (:func:`motion.plan_legs`), or why none."""
        return plan_legs(self.arm, self._qpos(), tuple(v / 1000 for v in self.tcp_mm()), self._current_yaw(), legs)


    # -- execution -------------------------------------------------------------------------------
    def _act(self, q: np.ndarray) -> None:
        self.sim_steps += 1
        with warnings.catch_warnings():  # ManiSkill 3.0.1 calls np.isnan on a torch tensor (a numpy 2 deprecation)
            warnings.filterwarnings("ignore", message="__array_wrap__", category=DeprecationWarning)
            self.env.step(np.concatenate([q[:7], [self.gripper]]).astype(np.float32)[None])

    def _run(self, plan: list) -> None:
        for path, grip in plan:
            for q in path:
                self._target_q = q
                self._act(q)
            self._hold_until_reached(path[-1] if path else self._qpos())
            if grip is not None:
                self.gripper = grip
                for _ in range(12):
                    self._act(self._target_q)
        self._scene_cache = None

    def _hold_until_reached(self, q: np.ndarray, tol: float = 0.01, most: int = 25) -> None:
        self._target_q = q
        for _ in range(most):
            if np.max(np.abs(self._qpos()[self.arm_mask] - q[self.arm_mask])) < tol:
                break
            self._act(q)

    def _rest_leg(self, yaw: float) -> Leg:
        return Leg((REST_MM[0] / 1000, REST_MM[1] / 1000, REST_MM[2] / 1000), yaw, 2 * _STEP_M)

    def _current_yaw(self) -> float:
        m = self.base.agent.tcp.pose.to_transformation_matrix()[0].cpu().numpy()
        closing = m[:3, 1]
        return math.atan2(closing[1], closing[0])

    # -- skills -----------------------------------------------------------------------------------
    def _pick(self, before: Scene, probe: Scene) -> SkillResult:
        name = probe.held
        assert name is not None
        b = before.bodies[name]
        actor = self.base.cubes[name]
        cube_yaw = yaw_of(actor.pose.q[0].cpu().numpy())
        others = [o.pos[:2] for o in before.bodies.values() if o.name != name]
        yaw = grasp_yaw(b.pos[:2], cube_yaw, others)
        x, y, z = (v / 1000 for v in b.pos)
        start_yaw = self._current_yaw()
        cur = tuple(v / 1000 for v in self.tcp_mm())
        legs = [Leg((cur[0], cur[1], max(cur[2], TRAVEL_M)), start_yaw, 2 * _STEP_M),
                Leg((x, y, TRAVEL_M), yaw, 2 * _STEP_M),
                Leg((x, y, z), yaw, _STEP_M, GRIPPER_CLOSED),
                Leg((x, y, TRAVEL_M), yaw, _STEP_M)]
        plan = self._plan(legs)
        if isinstance(plan, str):
            return SkillResult(False, f"no motion plan: {plan}")
        if self.gripper != GRIPPER_OPEN:
            self.gripper = GRIPPER_OPEN
        self._run(plan)
        after = self.scene()
        if after.held != name:
            return SkillResult(False, f"the grasp failed: the {name} is not in the gripper (it is at "
                                      f"{fmt_point(after.bodies[name].pos)})", True)
        return SkillResult(True, f"picked up the {name}", True)

    def _place(self, before: Scene, skill: Skill) -> SkillResult:
        name = before.held
        assert name is not None
        b = before.bodies[name]
        land = before.landing(b, skill.args[0], skill.args[1])
        assert not isinstance(land, str)
        support, lx, ly, lz = land
        tcp = self.tcp_mm()
        off = tuple((b.pos[i] - tcp[i]) / 1000 for i in range(3))  # held cube centre relative to the TCP
        tx, ty = lx / 1000 - off[0], ly / 1000 - off[1]
        tz = (lz + 3.0) / 1000 - off[2]
        yaw = self._current_yaw()
        cur = tuple(v / 1000 for v in tcp)
        legs = [Leg((cur[0], cur[1], max(cur[2], TRAVEL_M)), yaw, 2 * _STEP_M),
                Leg((tx, ty, max(TRAVEL_M, tz)), yaw, 2 * _STEP_M),
                Leg((tx, ty, tz), yaw, _STEP_M, GRIPPER_OPEN),
                Leg((tx, ty, TRAVEL_M), yaw, _STEP_M), self._rest_leg(yaw)]
        plan = self._plan(legs)
        if isinstance(plan, str):
            return SkillResult(False, f"no motion plan: {plan}")
        self._run(plan)
        after = self.scene()
        a = after.bodies[name]
        where = "on the table" if a.support == TABLE else "in the gripper" if a.support == GRIPPER else f"on the {a.support}"
        return SkillResult(True, f"placed the {name} {where} at {fmt_point(a.pos)}", True)

    def _push(self, before: Scene, skill: Skill, probe: Scene) -> SkillResult:
        p1, p2 = skill.args[:3], skill.args[3:]
        moved = [n for n in before.bodies if dist_xy(before.bodies[n].pos, probe.bodies[n].pos) > 1e-6]
        dx, dy = p2[0] - p1[0], p2[1] - p1[1]
        length = math.hypot(dx, dy)
        ux, uy = dx / length, dy / length
        back = FINGER_HALF_M
        a = (p1[0] / 1000 - ux * back, p1[1] / 1000 - uy * back, p1[2] / 1000)
        b = (p2[0] / 1000 - ux * back, p2[1] / 1000 - uy * back, p2[2] / 1000)
        # the closed fingers' wide side faces the push: close along the push direction
        yaw = math.atan2(uy, ux)
        yaw = yaw if math.cos(yaw - math.pi / 2) >= 0 else yaw + math.pi
        cur = tuple(v / 1000 for v in self.tcp_mm())
        start_yaw = self._current_yaw()
        legs = [Leg((cur[0], cur[1], max(cur[2], TRAVEL_M)), start_yaw, 2 * _STEP_M),
                Leg((a[0], a[1], TRAVEL_M), yaw, 2 * _STEP_M),
                Leg(a, yaw, _STEP_M),
                Leg(b, yaw, _PUSH_STEP_M),
                Leg((b[0], b[1], TRAVEL_M), yaw, _STEP_M), self._rest_leg(yaw)]
        plan = self._plan(legs)
        if isinstance(plan, str):
            return SkillResult(False, f"no motion plan: {plan}")
        self.gripper = GRIPPER_CLOSED
        for _ in range(8):
            self._act(self._qpos())
        self._run(plan)
        self.gripper = GRIPPER_OPEN
        for _ in range(8):
            self._act(self._target_q)
        self._scene_cache = None
        after = self.scene()
        name = moved[0] if moved else min(before.bodies, key=lambda n: dist_xy(before.bodies[n].pos, p1))
        changed = any(dist_xy(before.bodies[n].pos, after.bodies[n].pos) > 1.0 for n in after.bodies)
        return SkillResult(True, f"pushed the {name} to {fmt_point(after.bodies[name].pos)}", changed)


if __name__ == "__main__":
    if sys.argv[1:] == ["--check"]:
        from vagent.envs.primitive_skill.tabletop import check

        raise SystemExit(check())
    print("usage: python -m vagent.envs.primitive_skill.maniskill --check", file=sys.stderr)
    raise SystemExit(2)
