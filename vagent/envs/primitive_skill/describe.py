"""PrimitiveSkill's ground truth and its descriptions (pure): :func:`make_state` is the env's
``state()``; :func:`describe_state` writes it in a description style (the correct
``<observation>``/``<prediction>`` for the judges, the solver and the demos)."""

from __future__ import annotations

import json
from typing import Any, Mapping

from vagent.envs.formats import DESCRIPTION_STYLES
from vagent.envs.primitive_skill.sim import GRIPPER, Scene
from vagent.envs.primitive_skill.tasks import Task, TaskParams, stage_of


def _num(v: float) -> int | float:
    r = round(float(v), 1)
    return int(round(r)) if abs(r - round(r)) < 1e-9 else r


def _point(p) -> list[int | float]:
    return [_num(v) for v in p]


def make_state(scene: Scene, task: Task, params: TaskParams) -> dict[str, Any]:
    """The JSON-able ground truth (``PrimitiveSkillEnv.state()``): objects, targets, drawer,
    gripper, stage and ``relations`` (one per object with its ``position``, for the rule judge)."""
    objects = {b.name: {"position": _point(b.pos), "held": b.support == GRIPPER, "on": b.support}
               for b in scene.bodies.values()}
    relations = [{"object": b.name, "vertical": None, "horizontal": None, "position": _point(b.pos)}
                 for b in scene.bodies.values()]
    relations += [{"object": t.name, "vertical": None, "horizontal": None, "position": _point(t.pos)}
                  for t in scene.targets.values()]
    drawer = None
    if scene.drawer is not None:
        d = scene.drawer
        drawer = {"position": _point(d.position), "handle": _point(d.handle), "open_mm": _num(d.open),
                  "max_open_mm": _num(d.max_open)}
        relations += [{"object": "drawer", "vertical": None, "horizontal": None, "position": drawer["position"]},
                      {"object": "handle", "vertical": None, "horizontal": None, "position": drawer["handle"]}]
    return {
        "task": task.name,
        "objects": objects,
        "targets": {t.name: _point(t.pos) for t in scene.targets.values()},
        "drawer": drawer,
        "gripper": {"position": _point(scene.gripper), "holding": scene.held},
        "stage": stage_of(scene, task, params),
        "success": bool(task.success(scene, params)),
        "relations": relations,
    }


def _coords(p) -> str:
    return "(" + ", ".join(str(v) for v in p) + ")"


def describe_state(state: Mapping[str, Any], style: str) -> str:
    """A correct description of ``state`` in ``style``, one entry per judged object with its centre.

    structured: ``{"red_cube": [52, -80, 20], ..., "gripper": [0, 0, 200], "holding": null}``;
    natural: ``The red cube is at (52, -80, 20). ... The gripper is at (0, 0, 200).``;
    symbolic: one ``name (x, y, z)`` line per object, then ``gripper (x, y, z)``.
    A held object is marked ("in the gripper" / ``held``); the rule judge scores the positions.
    """
    if style not in DESCRIPTION_STYLES:
        raise ValueError(f"Unknown description style '{style}'; valid: {', '.join(DESCRIPTION_STYLES)}.")
    objects = state.get("objects", {})
    gripper = state["gripper"]
    rels = [(r["object"], r["position"]) for r in state["relations"]]
    if style == "structured":
        out: dict[str, Any] = {name: pos for name, pos in rels}
        out["gripper"], out["holding"] = gripper["position"], gripper["holding"]
        return json.dumps(out)
    lines = []
    for name, pos in rels:
        held = bool(objects.get(name, {}).get("held"))
        if style == "symbolic":
            lines.append(f"{name} {_coords(pos)}" + (" held" if held else ""))
        else:
            label = "drawer handle" if name == "handle" else name.replace("_", " ")
            where = "in the gripper at" if held else "at"
            lines.append(f"The {label} is {where} {_coords(pos)}.")
    if style == "symbolic":
        lines.append(f"gripper {_coords(gripper['position'])}")
        return "\n".join(lines)
    lines.append(f"The gripper is at {_coords(gripper['position'])}.")
    return " ".join(lines)


__all__ = ["make_state", "describe_state"]
