"""SVG attribute parsing shared by the PIL renderer and the shape reader: tag names, lengths,
point lists, presentation properties, colours and the user coordinate system. Pure functions of
:mod:`xml.etree.ElementTree` elements and attribute strings."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from typing import Any

from PIL import ImageColor

_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


def local_name(tag: Any) -> str:
    """``{namespace}name`` -> ``name`` (comments and processing instructions -> "")."""
    if not isinstance(tag, str):
        return ""
    return tag.rsplit("}", 1)[-1]


def parse_length(value: Any, default: float | None = None) -> float | None:
    """A number from an SVG length such as ``"12"``, ``"12px"``, ``"1.5e1"`` (units other than
    px and percentages -> ``default``)."""
    if value is None:
        return default
    text = str(value).strip()
    m = _NUMBER.match(text)
    if not m or text[m.end():].strip() not in ("", "px"):
        return default
    return float(m.group(0))


def parse_points(value: Any) -> list[tuple[float, float]]:
    nums = [float(x) for x in _NUMBER.findall(str(value or ""))]
    return list(zip(nums[0::2], nums[1::2]))


def element_style(el: ET.Element, inherited: dict[str, str] | None = None) -> dict[str, str]:
    """The presentation properties of ``el``: inherited ones, then attributes, then ``style``."""
    props = dict(inherited or {})
    for key in ("fill", "stroke", "stroke-width", "opacity", "fill-opacity", "stroke-opacity", "transform"):
        if key in el.attrib:
            props[key] = el.attrib[key].strip()
    for decl in el.attrib.get("style", "").split(";"):
        if ":" in decl:
            k, v = decl.split(":", 1)
            props[k.strip().lower()] = v.strip()
    return props


def parse_colour(value: str | None, default: tuple[int, int, int] | None) -> tuple[int, int, int] | None:
    """An RGB colour from an SVG paint (``none`` -> None, unparsable -> ``default``)."""
    if value is None:
        return default
    v = value.strip().lower()
    if v in ("none", "transparent"):
        return None
    try:
        rgb = ImageColor.getrgb(v)
    except ValueError:
        return default
    return tuple(rgb[:3])  # type: ignore[return-value]


def svg_canvas(root: ET.Element, width: int, height: int) -> tuple[float, float, float, float]:
    """(min_x, min_y, view_w, view_h) of the user coordinate system (viewBox, else width/height,
    else the output size)."""
    vb = [float(x) for x in _NUMBER.findall(root.attrib.get("viewBox", ""))]
    if len(vb) == 4 and vb[2] > 0 and vb[3] > 0:
        return vb[0], vb[1], vb[2], vb[3]
    w = parse_length(root.attrib.get("width"), float(width)) or float(width)
    h = parse_length(root.attrib.get("height"), float(height)) or float(height)
    return 0.0, 0.0, w, h


__all__ = ["local_name", "parse_length", "parse_points", "element_style", "parse_colour", "svg_canvas"]
