"""Navigation (VAGEN's embodied navigation): the env (``env.py``) and its state descriptions
(``describe.py``), procedural rooms and the BFS planner (``world.py``, with the furniture
catalogue in ``catalog.py`` and the egocentric geometry in ``relations.py``), the numpy egocentric
renderer (``raycast.py``) and the optional AI2-THOR backend (``ai2thor_backend.py``, imported only
when ``backend="ai2thor"``)."""

from vagent.envs.navigation.env import (
    ACTIONS, LEGEND, REWARD_PRESETS, NavigationConfig, NavigationEnv, describe_state, parse_navigation_response,
    relation_phrase, view_text,
)
from vagent.envs.navigation.raycast import RaycastWorld
from vagent.envs.navigation.world import (
    CATALOG, COLORS, Furniture, GenerationError, Pose, Room, RoomParams, generate_room, parse_layout, plan_path,
)

__all__ = [
    "ACTIONS", "LEGEND", "REWARD_PRESETS", "NavigationConfig", "NavigationEnv", "describe_state",
    "parse_navigation_response", "relation_phrase", "view_text", "CATALOG", "COLORS", "Furniture", "GenerationError",
    "Pose", "RaycastWorld", "Room", "RoomParams", "generate_room", "parse_layout", "plan_path",
]
