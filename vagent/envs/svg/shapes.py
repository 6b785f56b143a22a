"""Targets of the SVG env: random primitives from a seed, their SVG source, and their ground truth.

A :class:`Target` is a canvas with a background colour and a few :class:`Shape` primitives
(rectangle, circle, ellipse, line, polygon), drawn in order. :func:`generate_target` draws one
from a numpy Generator; :func:`target_from_svg` reads an SVG file (its simple-subset primitives
become the ground truth; everything else is still rendered but not described).

Positions for the reasoning judges are relative to the canvas centre on a ``grid`` x ``grid``
partition of the canvas (``grid`` odd, default 3): a shape's bounding-box centre falls in cell
``(row, col)``; relative to the centre cell ``(g//2, g//2)`` it is above/below/same (row) and
left/right/same (column). Generated targets put at most one shape in each cell and keep every
shape's centre at least ``margin`` x canvas away from the cell borders, so the relation words are
unambiguous and the symbolic grid shows every shape.
"""

from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
from PIL import ImageColor

from vagent.envs.grid import relation_phrase, relation_words
from vagent.envs.svg.attributes import element_style, local_name, parse_length, parse_points, svg_canvas

KINDS = ("rectangle", "circle", "ellipse", "line", "polygon")
SVG_TAG = {"rectangle": "rect", "circle": "circle", "ellipse": "ellipse", "line": "line", "polygon": "polygon"}
KIND_OF_TAG = {v: k for k, v in SVG_TAG.items()}

#: named shape colours (distinct, saturated, each nameable in one or two words)
PALETTE: dict[str, str] = {
    "red": "#e03131", "orange": "#f08c00", "yellow": "#fab005", "green": "#2f9e44", "teal": "#0c8599",
    "blue": "#1971c2", "purple": "#7048e8", "pink": "#d6336c", "brown": "#8b5a2b", "black": "#212529",
}
#: named light background colours
BACKGROUNDS: dict[str, str] = {
    "white": "#ffffff", "light gray": "#e9ecef", "light blue": "#d0ebff", "cream": "#fff3bf",
    "light green": "#d3f9d8", "light pink": "#ffdeeb",
}

#: grid symbols of each kind (upper case) and of a kind in the centre cell (lower case)
SYMBOLS = {"rectangle": "R", "circle": "C", "ellipse": "E", "line": "L", "polygon": "P"}
LEGEND = (". empty, + you (the canvas centre), " + ", ".join(f"{s} {k}" for k, s in SYMBOLS.items()) + ", "
          + ", ".join(f"{s.lower()} {k} at the centre (you)" for k, s in SYMBOLS.items()))


@dataclass(frozen=True)
class Shape:
    """One primitive: ``kind`` (a KINDS name), its colour name and hex, the SVG attributes of its
    geometry (in order), and its bounding box ``(x0, y0, x1, y1)`` in canvas units."""

    kind: str
    colour: str
    fill: str
    attrs: tuple[tuple[str, str], ...]
    bbox: tuple[float, float, float, float]

    @property
    def centre(self) -> tuple[float, float]:
        x0, y0, x1, y1 = self.bbox
        return (x0 + x1) / 2.0, (y0 + y1) / 2.0

    def svg(self) -> str:
        """The SVG element (lines are stroked, the others filled)."""
        geom = " ".join(f'{k}="{v}"' for k, v in self.attrs)
        paint = f'stroke="{self.fill}"' if self.kind == "line" else f'fill="{self.fill}"'
        return f"<{SVG_TAG[self.kind]} {geom} {paint}/>"


@dataclass(frozen=True)
class Target:
    """A target image: canvas size, background, shapes (drawing order), and its SVG source."""

    width: float
    height: float
    background: str
    background_fill: str
    shapes: tuple[Shape, ...]
    svg: str
    source: str = "generated"


def _num(x: float) -> str:
    return str(int(round(x))) if abs(x - round(x)) < 1e-9 else f"{x:.1f}"


def target_svg(width: int, height: int, background_fill: str, shapes: Sequence[Shape]) -> str:
    """The SVG document of a generated target (one element per line)."""
    lines = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}">',
             f'<rect x="0" y="0" width="{width}" height="{height}" fill="{background_fill}"/>']
    lines += [s.svg() for s in shapes]
    lines.append("</svg>")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Relations to the canvas centre
# ---------------------------------------------------------------------------------------------

def cell_of(point: tuple[float, float], width: float, height: float, grid: int) -> tuple[int, int]:
    """(row, col) of ``point`` in the ``grid`` x ``grid`` partition of the canvas (clamped)."""
    x, y = point
    col = min(grid - 1, max(0, int(math.floor(x * grid / width))))
    row = min(grid - 1, max(0, int(math.floor(y * grid / height))))
    return row, col


def border_distance(point: tuple[float, float], width: float, height: float, grid: int) -> float:
    """Distance, as a fraction of the canvas side, from ``point`` to the nearest inner cell border."""
    x, y = point[0] / width, point[1] / height
    borders = [k / grid for k in range(1, grid)]
    return min(min(abs(x - b) for b in borders), min(abs(y - b) for b in borders)) if borders else 1.0


def shape_relations(target: Target, grid: int) -> list[dict[str, Any]]:
    """``[{"object", "vertical", "horizontal", "cell"}]`` of each shape relative to the centre cell."""
    centre = (grid // 2, grid // 2)
    out = []
    for s in target.shapes:
        cell = cell_of(s.centre, target.width, target.height, grid)
        v, h = relation_words(centre, cell)
        out.append({"object": s.kind, "vertical": v, "horizontal": h, "cell": list(cell)})
    return out


def grid_rows(target: Target, grid: int) -> list[str]:
    """The symbolic grid (see LEGEND); a later shape in the same cell hides an earlier one."""
    rows = [["."] * grid for _ in range(grid)]
    c = grid // 2
    rows[c][c] = "+"
    for s in target.shapes:
        r, col = cell_of(s.centre, target.width, target.height, grid)
        sym = SYMBOLS[s.kind]
        rows[r][col] = sym.lower() if (r, col) == (c, c) else sym
    return ["".join(r) for r in rows]


def make_state(target: Target, grid: int) -> dict[str, Any]:
    """The JSON-able ground truth of a target (the env adds its episode counters)."""
    return {
        "canvas": [_json_num(target.width), _json_num(target.height)],
        "background": target.background,
        "background_fill": target.background_fill,
        "shapes": [{"object": s.kind, "colour": s.colour, "fill": s.fill,
                    "bbox": [_json_num(v) for v in s.bbox], "centre": [_json_num(v) for v in s.centre]}
                   for s in target.shapes],
        "relations": shape_relations(target, grid),
        "grid": grid_rows(target, grid),
        "grid_size": grid,
        "source": target.source,
    }


def _json_num(x: float) -> float | int:
    return int(x) if float(x).is_integer() else round(float(x), 2)


# ---------------------------------------------------------------------------------------------
# Descriptions
# ---------------------------------------------------------------------------------------------

def position_phrase(vertical: str, horizontal: str) -> str:
    """Where a shape is relative to the canvas centre, naming both axes with the judge's words.

    ("above", "left") -> "above and to the left of the centre"; ("same", "right") -> "to the
    right of the centre, in the same row"; ("below", "same") -> "below the centre, in the same
    column"; ("same", "same") -> "at the centre, in the same row and the same column as the centre".
    """
    return relation_phrase(vertical, horizontal, of="the centre",
                           same_place="at the centre, in the same row and the same column as the centre")


def describe_target_state(state: Mapping[str, Any], style: str) -> str:
    """A correct description of a target state (``make_state``) in natural / structured / symbolic."""
    if style == "symbolic":
        return "\n".join(state["grid"])
    shapes, rels = state["shapes"], state["relations"]
    if style == "structured":
        return json.dumps([{"object": r["object"], "colour": s["colour"], "vertical": r["vertical"],
                            "horizontal": r["horizontal"]} for s, r in zip(shapes, rels)])
    if style != "natural":
        raise ValueError(f"Unknown description style '{style}'; valid: natural, structured, symbolic.")
    sentences = [f"The background is {state['background']}."]
    for s, r in zip(shapes, rels):
        sentences.append(f"The {s['colour']} {r['object']} is {position_phrase(r['vertical'], r['horizontal'])}.")
    if not shapes:
        sentences.append("There are no shapes to report.")
    return " ".join(sentences)


def text_description(target: Target) -> str:
    """The exact geometry of a target in words (the observation of ``render="text"``)."""
    lines = [f"Canvas {_num(target.width)} x {_num(target.height)} (x to the right, y down), "
             f"background {target.background} ({target.background_fill}). Shapes, in drawing order:"]
    for i, s in enumerate(target.shapes, 1):
        a = dict(s.attrs)
        if s.kind == "rectangle":
            geo = f"top-left corner ({a['x']}, {a['y']}), width {a['width']}, height {a['height']}"
        elif s.kind == "circle":
            geo = f"centre ({a['cx']}, {a['cy']}), radius {a['r']}"
        elif s.kind == "ellipse":
            geo = f"centre ({a['cx']}, {a['cy']}), radii {a['rx']} and {a['ry']}"
        elif s.kind == "line":
            geo = f"from ({a['x1']}, {a['y1']}) to ({a['x2']}, {a['y2']}), {a.get('stroke-width', '1')} wide"
        else:
            geo = "corners " + ", ".join(f"({p})" for p in a["points"].split())
        lines.append(f"{i}. a {s.colour} ({s.fill}) {s.kind}: {geo}.")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Generation
# ---------------------------------------------------------------------------------------------

def _uniform_int(rng: np.random.Generator, lo: float, hi: float) -> int:
    lo_i, hi_i = int(math.ceil(lo)), int(math.floor(hi))
    return int(rng.integers(lo_i, hi_i + 1)) if hi_i > lo_i else lo_i


def _sample_shape(rng: np.random.Generator, kind: str, size: int, colour: str) -> Shape:
    """One primitive of ``kind`` fully inside a ``size`` x ``size`` canvas (integer coordinates)."""
    s, fill = float(size), PALETTE[colour]
    u = lambda lo, hi: _uniform_int(rng, lo * s, hi * s)  # noqa: E731 - a size fraction -> pixels
    if kind == "circle":
        r = u(0.08, 0.17)
        cx, cy = _uniform_int(rng, r, s - r), _uniform_int(rng, r, s - r)
        return Shape(kind, colour, fill, (("cx", str(cx)), ("cy", str(cy)), ("r", str(r))), (cx - r, cy - r, cx + r, cy + r))
    if kind == "ellipse":
        rx = u(0.08, 0.22)
        ry = u(0.08, 0.22)
        if abs(rx - ry) < 0.05 * s:  # keep it visibly not a circle
            ry = rx + int(math.ceil(0.05 * s)) if rx + 0.05 * s <= 0.24 * s else rx - int(math.ceil(0.05 * s))
        cx, cy = _uniform_int(rng, rx, s - rx), _uniform_int(rng, ry, s - ry)
        attrs = (("cx", str(cx)), ("cy", str(cy)), ("rx", str(rx)), ("ry", str(ry)))
        return Shape(kind, colour, fill, attrs, (cx - rx, cy - ry, cx + rx, cy + ry))
    if kind == "rectangle":
        w, h = u(0.15, 0.38), u(0.15, 0.38)
        x, y = _uniform_int(rng, 0, s - w), _uniform_int(rng, 0, s - h)
        attrs = (("x", str(x)), ("y", str(y)), ("width", str(w)), ("height", str(h)))
        return Shape(kind, colour, fill, attrs, (x, y, x + w, y + h))
    if kind == "line":
        sw = _uniform_int(rng, 2, max(3.0, s / 24))
        half = u(0.15, 0.3)
        angle = float(rng.uniform(0, math.pi))
        dx, dy = half * math.cos(angle), half * math.sin(angle)
        m = sw + abs(dx), sw + abs(dy)
        cx, cy = float(rng.uniform(m[0], s - m[0])), float(rng.uniform(m[1], s - m[1]))
        x1, y1, x2, y2 = (round(v) for v in (cx - dx, cy - dy, cx + dx, cy + dy))
        attrs = (("x1", str(x1)), ("y1", str(y1)), ("x2", str(x2)), ("y2", str(y2)), ("stroke-width", str(sw)))
        return Shape(kind, colour, fill, attrs, (min(x1, x2), min(y1, y2), max(x1, x2), max(y1, y2)))
    if kind == "polygon":
        k = int(rng.integers(3, 6))
        radius = float(rng.uniform(0.12, 0.22)) * s
        cx, cy = float(rng.uniform(radius, s - radius)), float(rng.uniform(radius, s - radius))
        theta0 = float(rng.uniform(0, 2 * math.pi))
        pts = []
        for i in range(k):
            t = theta0 + 2 * math.pi * (i + float(rng.uniform(-0.25, 0.25))) / k
            r = radius * float(rng.uniform(0.75, 1.0))
            pts.append((round(cx + r * math.cos(t)), round(cy + r * math.sin(t))))
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        attrs = (("points", " ".join(f"{x},{y}" for x, y in pts)),)
        return Shape(kind, colour, fill, attrs, (min(xs), min(ys), max(xs), max(ys)))
    raise ValueError(f"unknown shape kind {kind!r}; valid: {', '.join(KINDS)}")


def generate_target(rng: np.random.Generator, size: int, n_min: int, n_max: int, kinds: Sequence[str],
                    grid: int, margin: float, random_background: bool) -> Target:
    """A random target: ``n_min..n_max`` shapes of ``kinds``, distinct colours, one per grid cell,
    centres at least ``margin`` x size from the cell borders (resampled until they fit)."""
    n = int(rng.integers(n_min, n_max + 1))
    colours = [list(PALETTE)[int(i)] for i in rng.choice(len(PALETTE), size=n, replace=False)]
    bg_names = list(BACKGROUNDS)
    bg = bg_names[int(rng.integers(len(bg_names)))] if random_background else "white"
    shapes: list[Shape] = []
    taken: set[tuple[int, int]] = set()
    for colour in colours:
        for _ in range(10_000):
            kind = kinds[int(rng.integers(len(kinds)))]
            shape = _sample_shape(rng, kind, size, colour)
            cell = cell_of(shape.centre, size, size, grid)
            if cell not in taken and border_distance(shape.centre, size, size, grid) >= margin:
                taken.add(cell)
                shapes.append(shape)
                break
        else:  # pragma: no cover - the config check keeps n <= cells and margin small
            raise RuntimeError(f"could not place shape {len(shapes) + 1} of {n} on a {grid}x{grid} grid")
    svg = target_svg(size, size, BACKGROUNDS[bg], shapes)
    return Target(float(size), float(size), bg, BACKGROUNDS[bg], tuple(shapes), svg)


# ---------------------------------------------------------------------------------------------
# Targets from SVG files
# ---------------------------------------------------------------------------------------------

def nearest_colour_name(rgb: tuple[int, int, int]) -> str:
    """The closest name among PALETTE, BACKGROUNDS and the CSS colour names (Euclidean in RGB)."""
    best, best_d = "black", float("inf")
    names = {**PALETTE, **BACKGROUNDS}
    for name, value in list(names.items()) + list(ImageColor.colormap.items()):
        try:
            c = ImageColor.getrgb(value) if isinstance(value, str) else value
        except ValueError:
            continue
        d = sum((int(a) - int(b)) ** 2 for a, b in zip(rgb, c[:3]))
        if d < best_d:
            best, best_d = name, d
    return best


def _hex(rgb: tuple[int, int, int]) -> str:
    return "#{:02x}{:02x}{:02x}".format(*rgb)


def _parsed_shape(name: str, el: ET.Element, props: dict[str, str]) -> Shape | None:
    g = el.attrib.get
    kind = KIND_OF_TAG.get(name)
    paint = props.get("stroke") if kind == "line" else props.get("fill", "black")
    try:
        rgb = ImageColor.getrgb(paint.strip()) if paint and paint.strip().lower() not in ("none", "transparent") else None
    except ValueError:
        rgb = None
    if kind is None or rgb is None:
        return None
    rgb = tuple(rgb[:3])
    if kind == "rectangle":
        x, y, w, h = (parse_length(g(k), 0.0) for k in ("x", "y", "width", "height"))
        bbox = (x, y, x + w, y + h) if w > 0 and h > 0 else None
    elif kind in ("circle", "ellipse"):
        cx, cy = parse_length(g("cx"), 0.0), parse_length(g("cy"), 0.0)
        rx = parse_length(g("r") if kind == "circle" else g("rx"), 0.0)
        ry = rx if kind == "circle" else parse_length(g("ry"), 0.0)
        bbox = (cx - rx, cy - ry, cx + rx, cy + ry) if rx > 0 and ry > 0 else None
    elif kind == "line":
        x1, y1, x2, y2 = (parse_length(g(k), 0.0) for k in ("x1", "y1", "x2", "y2"))
        bbox = (min(x1, x2), min(y1, y2), max(x1, x2), max(y1, y2))
    else:
        pts = parse_points(g("points"))
        bbox = (min(p[0] for p in pts), min(p[1] for p in pts), max(p[0] for p in pts), max(p[1] for p in pts)) if len(pts) >= 3 else None
    if bbox is None:
        return None
    attrs = tuple((k, v) for k, v in el.attrib.items() if k in ("x", "y", "width", "height", "cx", "cy", "r", "rx", "ry",
                                                             "x1", "y1", "x2", "y2", "points", "stroke-width"))
    return Shape(kind, nearest_colour_name(rgb), _hex(rgb), attrs, bbox)


def target_from_svg(svg: str, root: ET.Element, source: str) -> Target:
    """A target from an SVG document (already checked by ``render.check_svg``): its primitives
    outside transformed groups become the ground truth; a first rect covering the canvas is the
    background (else white)."""
    min_x, min_y, w, h = svg_canvas(root, int(parse_length(root.attrib.get("width"), 100.0) or 100),
                                    int(parse_length(root.attrib.get("height"), 100.0) or 100))
    shapes: list[Shape] = []
    background, background_fill = "white", "#ffffff"

    def visit(el: ET.Element, inherited: dict[str, str]) -> None:
        nonlocal background, background_fill
        name = local_name(el.tag)
        if "transform" in el.attrib or name in ("defs", "clipPath", "mask", "pattern", "symbol", "marker"):
            return
        props = element_style(el, inherited)
        if name in ("svg", "g"):
            for child in el:
                visit(child, props)
            return
        shape = _parsed_shape(name, el, props)
        if shape is None:
            return
        x0, y0, x1, y1 = shape.bbox
        if (not shapes and shape.kind == "rectangle" and x0 <= min_x and y0 <= min_y and x1 >= min_x + w
                and y1 >= min_y + h):
            background, background_fill = shape.colour, shape.fill
            return
        shifted = (x0 - min_x, y0 - min_y, x1 - min_x, y1 - min_y)
        shapes.append(Shape(shape.kind, shape.colour, shape.fill, shape.attrs, shifted))

    visit(root, {})
    return Target(w, h, background, background_fill, tuple(shapes), svg, source)


__all__ = ["KINDS", "PALETTE", "BACKGROUNDS", "SYMBOLS", "LEGEND", "Shape", "Target", "target_svg", "cell_of",
           "border_distance", "shape_relations", "grid_rows", "make_state", "position_phrase",
           "describe_target_state", "text_description", "generate_target", "nearest_colour_name", "target_from_svg"]
