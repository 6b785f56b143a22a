"""The PIL fallback renderer of the simple SVG subset (see :mod:`vagent.envs.svg.render`).

rect, circle, ellipse, line, polyline, polygon and ``g`` with fill/stroke/stroke-width/opacity
attributes or ``style``, ``viewBox`` scaling; 4x supersampled. Anything else is skipped and
listed in the notes it returns. Input is an SVG tree already checked by
:func:`vagent.envs.svg.render.check_svg`.
"""

from __future__ import annotations

import time
import xml.etree.ElementTree as ET
from typing import Any

from PIL import Image, ImageDraw

from vagent.envs.svg.attributes import element_style, local_name, parse_colour, parse_length, parse_points, svg_canvas

_SUPERSAMPLE = 4
_SHAPES = ("rect", "circle", "ellipse", "line", "polyline", "polygon")


def on_white(image: Image.Image) -> Image.Image:
    """Composite an RGBA image onto white and return RGB."""
    image = image.convert("RGBA")
    base = Image.new("RGBA", image.size, (255, 255, 255, 255))
    base.alpha_composite(image)
    return base.convert("RGB")


def _alpha(props: dict[str, str], key: str) -> float:
    a = parse_length(props.get("opacity"), 1.0) or 0.0
    b = parse_length(props.get(key), 1.0) or 0.0
    return max(0.0, min(1.0, a)) * max(0.0, min(1.0, b))


def _shape_geometry(name: str, el: ET.Element) -> tuple[str, Any] | None:
    """(PIL primitive, user-space coordinates) of a subset element, or None if degenerate."""
    g = el.attrib.get
    if name == "rect":
        x, y = parse_length(g("x"), 0.0), parse_length(g("y"), 0.0)
        w, h = parse_length(g("width")), parse_length(g("height"))
        if w is None or h is None or w <= 0 or h <= 0:
            return None
        return "polygon", [(x, y), (x + w, y), (x + w, y + h), (x, y + h)]
    if name in ("circle", "ellipse"):
        cx, cy = parse_length(g("cx"), 0.0), parse_length(g("cy"), 0.0)
        rx = parse_length(g("r") if name == "circle" else g("rx"))
        ry = rx if name == "circle" else parse_length(g("ry"))
        if rx is None or ry is None or rx <= 0 or ry <= 0:
            return None
        return "ellipse", [(cx - rx, cy - ry), (cx + rx, cy + ry)]
    if name == "line":
        pts = [(parse_length(g("x1"), 0.0), parse_length(g("y1"), 0.0)), (parse_length(g("x2"), 0.0), parse_length(g("y2"), 0.0))]
        return "line", pts
    pts = parse_points(g("points"))
    if len(pts) < 2:
        return None
    return ("polygon" if name == "polygon" else "line"), pts


def pil_render(root: ET.Element, width: int, height: int, timeout_s: float = 0.0) -> tuple[Image.Image, tuple[str, ...]]:
    """Rasterise the simple subset of an already checked SVG tree (see the module docstring).

    ``timeout_s > 0``: raise TimeoutError once drawing has taken longer (checked per element; each
    element composites a full supersampled layer). Returns (RGB image on white, notes about
    skipped elements/attributes)."""
    deadline = time.monotonic() + timeout_s if timeout_s > 0 else None
    s = _SUPERSAMPLE
    min_x, min_y, vw, vh = svg_canvas(root, width, height)
    sx, sy = width * s / vw, height * s / vh
    layer = Image.new("RGBA", (width * s, height * s), (0, 0, 0, 0))
    notes: list[str] = []

    def to_px(pts: list[tuple[float, float]]) -> list[tuple[float, float]]:
        return [((x - min_x) * sx, (y - min_y) * sy) for x, y in pts]

    def paint(el: ET.Element, inherited: dict[str, str]) -> None:
        nonlocal layer
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError
        name = local_name(el.tag)
        props = element_style(el, inherited)
        if "transform" in el.attrib:
            notes.append(f"<{name}> transform ignored")
        if name in ("svg", "g"):
            for child in el:
                paint(child, {k: v for k, v in props.items() if k != "opacity"} | (
                    {"opacity": props["opacity"]} if "opacity" in props else {}))
            return
        if name not in _SHAPES:
            if name and name not in ("title", "desc", "metadata", "defs"):
                notes.append(f"<{name}> is not supported by the pil renderer")
            return
        geom = _shape_geometry(name, el)
        if geom is None:
            return
        kind, pts = geom
        pts = to_px(pts)
        fill = parse_colour(props.get("fill"), (0, 0, 0)) if kind != "line" else None
        stroke = parse_colour(props.get("stroke"), None)
        sw = (parse_length(props.get("stroke-width"), 1.0) or 0.0) * (sx + sy) / 2
        over = Image.new("RGBA", layer.size, (0, 0, 0, 0))
        draw = ImageDraw.Draw(over)
        if fill is not None:
            a = round(255 * _alpha(props, "fill-opacity"))
            if kind == "ellipse":
                draw.ellipse([pts[0], pts[1]], fill=fill + (a,))
            elif kind == "polygon":
                draw.polygon(pts, fill=fill + (a,))
        if stroke is not None and sw > 0:
            a = round(255 * _alpha(props, "stroke-opacity"))
            w = max(1, round(sw))
            if kind == "ellipse":
                draw.ellipse([pts[0], pts[1]], outline=stroke + (a,), width=w)
            else:
                closed = pts + [pts[0]] if kind == "polygon" else pts
                draw.line(closed, fill=stroke + (a,), width=w, joint="curve")
        layer = Image.alpha_composite(layer, over)

    paint(root, {})
    image = on_white(layer.resize((width, height), Image.Resampling.BOX))
    return image, tuple(dict.fromkeys(notes))


__all__ = ["pil_render", "on_white"]
