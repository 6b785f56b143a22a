"""The navigation env's words for its state (pure): the natural phrase of a relation, the
correct description of a state in each description style (the judges', the solver's and the
demos' ``<observation>``/``<prediction>``) and the text render of the view.

States are those of ``NavigationEnv.state()`` (see :mod:`vagent.envs.navigation.env`).
"""

from __future__ import annotations

import json
from typing import Any, Mapping

from vagent.envs.formats import DESCRIPTION_STYLES

_PHRASES = {
    ("ahead", "same"): "directly ahead of you", ("behind", "same"): "directly behind you",
    ("same", "left"): "to your left", ("same", "right"): "to your right",
    ("ahead", "left"): "ahead of you and to the left", ("ahead", "right"): "ahead of you and to the right",
    ("behind", "left"): "behind you and to the left", ("behind", "right"): "behind you and to the right",
    ("same", "same"): "here",
}


def relation_phrase(vertical: str, horizontal: str) -> str:
    """Natural words for a relation, naming both axes as the rule judge reads them
    (``("ahead", "right")`` -> ``"ahead of you and to the right"``; ``("same", "left")`` -> ``"to your left"``)."""
    return _PHRASES[(vertical, horizontal)]


def object_label(entry: Mapping[str, Any]) -> str:
    """``"red sofa"`` (just the type when there is no colour, as with AI2-THOR)."""
    return f"{entry.get('color') or ''} {entry['object']}".strip()


def _entries(state: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The target first, then the visible non-target objects (the objects of ``relations``)."""
    return [state["target"]] + [o for o in state["visible_objects"] if not o.get("is_target")]


def describe_state(state: Mapping[str, Any], style: str) -> str:
    """A correct description of ``state`` in ``style``.

    natural: ``The red sofa (the target) is ahead of you and to the right, 2.4 m away. The green
    lamp is directly ahead of you, 3.1 m away.``; structured: JSON
    ``{"target": "red sofa", "sofa": ["ahead", "right"], "lamp": ["ahead", "same"], "distance_m":
    {"sofa": 2.4, "lamp": 3.1}}``; symbolic: the egocentric room map (``state["map"]``, LEGEND).
    The rule judge scores natural and structured (its grid parser speaks above/below, not
    ahead/behind, so it does not score the symbolic map).
    """
    if style not in DESCRIPTION_STYLES:
        raise ValueError(f"Unknown description style '{style}'; valid: {', '.join(DESCRIPTION_STYLES)}.")
    entries = _entries(state)
    if style == "symbolic":
        if "map" not in state:
            raise ValueError("symbolic navigation descriptions need state['map'] (backend='raycast')")
        return "\n".join(state["map"])
    if style == "structured":
        out: dict[str, Any] = {"target": object_label(entries[0])}
        for e in entries:
            out[e["object"]] = [e["vertical"], e["horizontal"]]
        out["distance_m"] = {e["object"]: round(float(e["distance"]), 1) for e in entries}
        return json.dumps(out)
    sentences = []
    for i, e in enumerate(entries):
        label = object_label(e) + (" (the target)" if i == 0 else "")
        sentences.append(f"The {label} is {relation_phrase(e['vertical'], e['horizontal'])}, "
                         f"{float(e['distance']):.1f} m away.")
    return " ".join(sentences)


def view_text(state: Mapping[str, Any]) -> str:
    """The text render: free distance ahead and every visible object (direction and distance)."""
    ahead = state.get("obstacle_ahead")
    lines = [] if ahead is None else [f"The nearest obstacle straight ahead is {ahead:.2f} m away."]
    seen = state["visible_objects"]
    if not seen:
        lines.append("You see no furniture.")
    for o in seen:
        lines.append(f"You see the {object_label(o)} {relation_phrase(o['vertical'], o['horizontal'])}, "
                     f"{float(o['distance']):.1f} m away.")
    return "\n".join(lines)


__all__ = ["relation_phrase", "object_label", "describe_state", "view_text"]
