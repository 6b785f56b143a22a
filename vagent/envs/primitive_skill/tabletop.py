"""Our ManiSkill 3 tabletop for ``PrimitiveSkillEnv(backend="maniskill")``: the install, the
availability checks and the scene; the backend that runs skills on it is
:mod:`vagent.envs.primitive_skill.maniskill`.

Install: ``scripts/maniskill-env`` (ManiSkill in ``.venv-maniskill`` layered on ``.venv``, and Mesa
25's lavapipe, a Vulkan device on the CPU, in ``.cache/mesa``; ``pip install 'vagent[maniskill]'``
plus a Vulkan driver elsewhere). When ``VK_ICD_FILENAMES`` is unset and the repository has
``.cache/mesa/lvp_icd.json``, this module points Vulkan at it before SAPIEN starts.

Scene (our own ManiSkill env, :func:`tabletop_env_class`): ManiSkill's table and Panda (base at
x = -615 mm, as in its tabletop tasks), the task's cubes (40 mm, the kinematic colours) and flat
red-white target discs (radius 50 mm, no collision). The world frame is our frame in metres. A
reset draws the layout with the kinematic builder (``task.build(default_rng(seed))``), so a seed gives
the same layout on both backends, and puts the arm in its rest pose (the gripper at ``REST_MM``,
out of the camera's view).

``drawer`` needs ManiSkill's PartNet-Mobility cabinet and YCB apple (downloads) and is refused at
``make()`` with the download commands (:func:`drawer_refusal`). :func:`unavailable_reason` says why
the backend cannot run here (ManiSkill missing, no Vulkan device).
"""

from __future__ import annotations

import math
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from vagent.envs.primitive_skill.tasks import COLORS, CUBE_HALF

INSTALL_HINT = (
    "backend='maniskill' needs ManiSkill 3 and a Vulkan device: run scripts/maniskill-env in a vagent checkout "
    "(it installs vagent[maniskill] into .venv-maniskill and Mesa's lavapipe into .cache/mesa; then use "
    ".venv-maniskill/bin/python), or `pip install 'vagent[maniskill]'` beside a Vulkan driver. Without them use "
    "backend='kinematic' (the default): the same skills and tasks on our CPU simulator."
)
DRAWER_ASSETS = (("partnet_mobility", "partnet_mobility_cabinet"), ("assets/mani_skill2_ycb", "ycb"))
#: the Panda's base, as in ManiSkill's tabletop tasks (metres)
ROBOT_BASE = (-0.615, 0.0, 0.0)
_CAMERA_HEIGHT_M = 1.2
_VIEW_CENTRE_M = (0.0025, 0.0)  # the kinematic image's centre (x, y)
_VIEW_HALF_M = 0.215


# ---------------------------------------------------------------------------------------------
# Availability (python -m vagent.envs.primitive_skill.maniskill --check)
# ---------------------------------------------------------------------------------------------

def _repo_root() -> Path:
    return Path(__file__).resolve().parents[3]


def setup_vulkan() -> str | None:
    """Point Vulkan at the repository's lavapipe (``.cache/mesa/lvp_icd.json``, from
    scripts/maniskill-env) unless ``VK_ICD_FILENAMES`` is set already; returns the json used."""
    if os.environ.get("VK_ICD_FILENAMES"):
        return os.environ["VK_ICD_FILENAMES"]
    icd = Path(os.environ.get("VAGENT_MESA_DIR", _repo_root() / ".cache" / "mesa")) / "lvp_icd.json"
    if icd.is_file():
        os.environ["VK_ICD_FILENAMES"] = str(icd)
        return str(icd)
    return None


def import_maniskill() -> Any:
    """The ``mani_skill`` package (after :func:`setup_vulkan`), or ImportError with the install hint."""
    setup_vulkan()
    try:
        with warnings.catch_warnings():  # "Failed to find system libvulkan. Fallback to SAPIEN builtin libvulkan."
            warnings.filterwarnings("ignore", message=".*libvulkan.*")
            import sapien  # noqa: F401
            import mani_skill
            import mani_skill.envs  # noqa: F401
    except ImportError as exc:
        raise ImportError(f"{INSTALL_HINT} (import failed: {exc})") from exc
    return mani_skill


def drawer_refusal(asset_dir: Path) -> str:
    """Why ``drawer`` cannot run on ManiSkill here, naming the download commands."""
    missing = [group for sub, group in DRAWER_ASSETS if not (asset_dir / sub).is_dir()]
    cmds = " and ".join(f"`python -m mani_skill.utils.download_asset {g} -y`" for g in (missing or [g for _, g in DRAWER_ASSETS]))
    if missing:
        return (f"primitive_skill task 'drawer' on backend='maniskill' needs ManiSkill assets that are not in "
                f"{asset_dir}: {', '.join(missing)}. Download them with {cmds} (MS_ASSET_DIR sets the folder), "
                "or use backend='kinematic'.")
    return ("primitive_skill task 'drawer' on backend='maniskill' is not mapped yet (its assets are present in "
            f"{asset_dir}, but vagent has no ManiSkill drawer scene); use backend='kinematic'.")


# ---------------------------------------------------------------------------------------------
# The ManiSkill env (built lazily: mani_skill is imported only when asked)
# ---------------------------------------------------------------------------------------------

_ENV_CLASS: Any = None


def tabletop_env_class() -> Any:
    """Our ManiSkill ``BaseEnv``: table, Panda, the cubes and targets named in ``bodies`` /
    ``targets``; ``set_layout`` before ``reset`` fixes where they stand; a top-down camera."""
    global _ENV_CLASS
    if _ENV_CLASS is not None:
        return _ENV_CLASS
    import_maniskill()
    import sapien
    import torch
    from mani_skill.envs.sapien_env import BaseEnv
    from mani_skill.sensors.camera import CameraConfig
    from mani_skill.utils import sapien_utils
    from mani_skill.utils.building import actors
    from mani_skill.utils.scene_builder.table import TableSceneBuilder
    from mani_skill.utils.structs import Pose
    from transforms3d.euler import euler2quat

    class VagentTabletopEnv(BaseEnv):
        SUPPORTED_ROBOTS = ["panda"]

        def __init__(self, *args, bodies: tuple[str, ...] = (), targets: tuple[str, ...] = (),
                     image_size: int = 128, **kwargs):
            self.body_names, self.target_names, self.image_size = tuple(bodies), tuple(targets), int(image_size)
            self.layout: dict[str, tuple[float, float, float]] = {}
            self.rest_qpos: np.ndarray | None = None
            super().__init__(*args, robot_uids="panda", **kwargs)

        @property
        def _default_sensor_configs(self):
            return []

        @property
        def _default_human_render_camera_configs(self):
            cx, cy = _VIEW_CENTRE_M
            pose = sapien_utils.look_at(eye=[cx, cy, _CAMERA_HEIGHT_M], target=[cx, cy, 0.0], up=[1.0, 0.0, 0.0])
            fov = 2 * math.atan(_VIEW_HALF_M / _CAMERA_HEIGHT_M)
            return CameraConfig("top_camera", pose=pose, width=self.image_size, height=self.image_size, fov=fov,
                                near=0.05, far=10)

        def _load_agent(self, options: dict):
            super()._load_agent(options, sapien.Pose(p=list(ROBOT_BASE)))

        def _load_scene(self, options: dict):
            self.table_scene = TableSceneBuilder(env=self, robot_init_qpos_noise=0.0)
            self.table_scene.build()
            self.cubes = {}
            for name in self.body_names:
                rgba = np.array([*COLORS[name], 255]) / 255
                self.cubes[name] = actors.build_cube(self.scene, half_size=CUBE_HALF[0] / 1000, color=rgba, name=name,
                                                     initial_pose=sapien.Pose(p=[0, 0, CUBE_HALF[2] / 1000]))
            self.targets = {}
            for name in self.target_names:
                self.targets[name] = actors.build_red_white_target(
                    self.scene, radius=0.05, thickness=1e-5, name=name, add_collision=False, body_type="kinematic",
                    initial_pose=sapien.Pose(p=[0, 0, 1e-3], q=euler2quat(0, np.pi / 2, 0)))

        def _initialize_episode(self, env_idx, options: dict):
            self.table_scene.initialize(env_idx)
            if self.rest_qpos is not None:
                self.agent.reset(self.rest_qpos[None])
            for name, actor in {**self.cubes, **self.targets}.items():
                x, y, z = self.layout.get(name, (0.0, 0.0, 0.0))
                q = [1.0, 0.0, 0.0, 0.0] if name in self.cubes else [float(v) for v in euler2quat(0, np.pi / 2, 0)]
                z = z if name in self.cubes else 1e-3
                actor.set_pose(Pose.create_from_pq(p=torch.tensor([[x, y, z]], dtype=torch.float32),
                                                   q=torch.tensor([q], dtype=torch.float32)))
                if name in self.cubes:
                    actor.set_linear_velocity(torch.zeros((1, 3)))
                    actor.set_angular_velocity(torch.zeros((1, 3)))

        def evaluate(self):
            return {}

        def _get_obs_extra(self, info: dict):
            return {}

    _ENV_CLASS = VagentTabletopEnv
    return _ENV_CLASS


def vulkan_device() -> str:
    """The name of the Vulkan device SAPIEN renders on (a RenderSystem is created), or RuntimeError
    saying what is missing."""
    import_maniskill()
    import sapien

    try:
        sapien.render.RenderSystem(sapien.Device("cpu"))
    except RuntimeError as exc:
        raise RuntimeError(
            f"SAPIEN found no Vulkan device ({exc}); VK_ICD_FILENAMES={os.environ.get('VK_ICD_FILENAMES')}. "
            "Run scripts/maniskill-env (Mesa 25's lavapipe into .cache/mesa; Debian 12's own Mesa 22 is refused) "
            "or install a Vulkan driver.") from exc
    summary = sapien.render.get_device_summary() if hasattr(sapien.render, "get_device_summary") else ""
    first = next((line for line in summary.splitlines() if line.strip().startswith("GPU:")), "GPU: ?")
    return first.split(":", 1)[1].strip()


def unavailable_reason() -> str | None:
    """Why ``backend="maniskill"`` cannot run here (ManiSkill missing, no Vulkan device), or None."""
    try:
        vulkan_device()
    except (ImportError, RuntimeError) as exc:
        return str(exc)
    return None


def check() -> int:
    """``python -m vagent.envs.primitive_skill.maniskill --check``: print the Vulkan device (0), or what is
    missing (1)."""
    t0 = time.perf_counter()
    why = unavailable_reason()
    if why is not None:
        print(f"maniskill check: FAILED: {why}", file=sys.stderr)
        return 1
    import mani_skill
    import sapien

    print(f"maniskill check: ok (mani_skill {mani_skill.__version__}, sapien {sapien.__version__}, Vulkan device "
          f"{vulkan_device()!r} via {os.environ.get('VK_ICD_FILENAMES') or 'the system loader'}; "
          f"{time.perf_counter() - t0:.1f} s)")
    return 0
