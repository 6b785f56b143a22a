"""The PrimitiveSkill env's options (:class:`PrimitiveSkillConfig`); the env is in
:mod:`vagent.envs.primitive_skill.env`, which re-exports the class, and the prompts in
:mod:`vagent.envs.primitive_skill.prompts` read it."""

from __future__ import annotations

from dataclasses import dataclass

from vagent.envs.registry import EnvConfig

__all__ = ["PrimitiveSkillConfig"]


@dataclass
class PrimitiveSkillConfig(EnvConfig):
    """PrimitiveSkill options (the shared EnvConfig fields come first)."""

    #: how state descriptions are written; structured (JSON with coordinates) is the paper's best here
    description_style: str = "structured"
    #: the most skills executed from one reply; extra ones are dropped
    max_actions_per_turn: int = 2
    #: the task: align, place, stack or drawer (VAGEN's AlignTwoCube, PlaceTwoCube, StackThreeCube, PutAppleInDrawer)
    task: str = "align"
    #: simulator: "kinematic" (ours, deterministic) or "maniskill" (ManiSkill 3 physics and camera; scripts/maniskill-env)
    backend: str = "kinematic"
    #: drawer task: the drawer must be closed again at the end (VAGEN's PutAppleInDrawer success)
    drawer_close: bool = False
    #: turns (step calls) before the episode is truncated
    max_steps: int = 10
    #: side of the rendered top-down image in pixels (render="vision")
    image_size: int = 128
    #: pick: largest horizontal distance (mm) from the target point to the object's centre
    grasp_tolerance: float = 15.0
    #: push: largest distance (mm) from the start point to the pushed object's side or the drawer handle
    push_tolerance: float = 25.0
    #: place: largest distance (mm) from a cube's centre at which a placed object snaps onto it
    stack_tolerance: float = 20.0
    #: place: how far (mm) z may be below the resting centre height before it counts as a collision
    place_z_tolerance: float = 15.0
    #: align task: largest |x| (mm) of an aligned cube (VAGEN: 10)
    align_tolerance: float = 10.0
    #: reward per stage of progress; None = from the `rewards` preset (lite 0.2, paper 2)
    reward_stage: float | None = None
    #: progress value of a solved task; None = preset (lite 1.0, paper 10)
    reward_success: float | None = None
    #: format bonus per turn (correct format and >= 1 executed skill); None = preset (0.1)
    reward_format: float | None = None
    #: cost per executed skill; None = preset (lite 0, paper 0.1 as VAGEN's compute_reward)
    reward_action_cost: float | None = None
