"""The records of a ViGoRL example and its image geometry: :class:`Shape`, :class:`Example`, drawing
and describing a synthetic scene, and the mapping between shown and original pixels.

Geometry: the model sees the original image resized so its long side is ``image_size``
(:func:`display_size`); a shown pixel maps to the original pixel holding its centre,
``x_o = floor((x + 0.5) * W / w)`` (and back the same way). A zoom crop (:func:`zoom_crop`) is the square
``[x_o - half, x_o + half)`` of the ORIGINAL image around the mapped point, padded with
``PAD_COLOUR`` where it leaves the image (deviation: ViGoRL clips the window at the border, so
its crop is not centred there), resized to ``image_size`` x ``image_size``, optionally with a red
dot at the centre.

Datasets, scoring and the synthetic generator are :mod:`vagent.vigorl.data`, which re-exports
these names.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

from PIL import Image, ImageDraw

from vagent.vigorl.grounding import Point, format_point

PALETTE: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40), "green": (40, 160, 70), "blue": (40, 90, 220),
    "yellow": (235, 195, 30), "purple": (140, 60, 190), "orange": (240, 130, 30),
}
KINDS = ("circle", "square", "triangle")
BACKGROUND = (238, 238, 232)
PAD_COLOUR = (128, 128, 128)
DOT_COLOUR = (255, 0, 0)


@dataclass(frozen=True)
class Shape:
    """A synthetic shape: ``kind`` in KINDS, ``colour`` in PALETTE, centre ``(x, y)``, half-size ``r``
    (original pixels); it fills the box ``[x - r, x + r]`` x ``[y - r, y + r]``."""

    kind: str
    colour: str
    x: int
    y: int
    r: int

    @property
    def bbox(self) -> tuple[int, int, int, int]:
        return (self.x - self.r, self.y - self.r, self.x + self.r, self.y + self.r)

    @property
    def name(self) -> str:
        return f"{self.colour} {self.kind}"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "colour": self.colour, "x": self.x, "y": self.y, "r": self.r}


@dataclass(frozen=True)
class Example:
    """One question about one image.

    ``answer`` (text) or ``bbox`` (original pixels, inclusive) is the ground truth; ``point`` fills
    the question's ``{point}``; ``shapes`` is set for synthetic scenes (rendered on demand when
    ``image_path`` is None); ``size`` is the original image's (width, height).
    """

    id: str
    question: str
    size: tuple[int, int]
    answer: str | None = None
    bbox: tuple[int, int, int, int] | None = None
    point: Point | None = None
    image_path: str | None = None
    shapes: tuple[Shape, ...] = ()
    description: str | None = None
    split: str | None = None
    seed: int | None = None
    meta: dict = field(default_factory=dict, compare=False)

    @property
    def kind(self) -> str:
        """``"bbox"`` (answer with a point inside the box) or ``"text"``."""
        return "bbox" if self.bbox is not None else "text"

    def load_image(self) -> Image.Image:
        """The original image (RGB): read from ``image_path`` or rendered from ``shapes``."""
        if self.image_path is not None:
            with Image.open(self.image_path) as im:
                return im.convert("RGB")
        return render_scene(self.shapes, self.size)


def render_scene(shapes: Sequence[Shape], size: Sequence[int]) -> Image.Image:
    """Draw ``shapes`` on a BACKGROUND canvas of ``size`` (no anti-aliasing: exact palette colours)."""
    image = Image.new("RGB", (int(size[0]), int(size[1])), BACKGROUND)
    draw = ImageDraw.Draw(image)
    for s in shapes:
        colour = PALETTE[s.colour]
        x1, y1, x2, y2 = s.bbox
        if s.kind == "circle":
            draw.ellipse([x1, y1, x2, y2], fill=colour)
        elif s.kind == "square":
            draw.rectangle([x1, y1, x2, y2], fill=colour)
        else:  # triangle, apex up: (x, y - r), (x - r, y + r), (x + r, y + r)
            draw.polygon([(s.x, y1), (x1, y2), (x2, y2)], fill=colour)
    return image


def describe_scene(shapes: Sequence[Shape], size: Sequence[int]) -> str:
    """The scene as text (``render="text"``), in original pixels."""
    parts = [f"a {s.name} centred at {format_point((s.x, s.y))} with half-size {s.r}" for s in shapes]
    return (f"A {size[0]} x {size[1]} image on a light grey background with " + "; ".join(parts) + "."
            if parts else f"An empty {size[0]} x {size[1]} image.")


# ---------------------------------------------------------------------------------------------
# Geometry
# ---------------------------------------------------------------------------------------------

def display_size(size: Sequence[int], image_size: int) -> tuple[int, int]:
    """The shown size: the original ``(W, H)`` scaled so its long side is ``image_size``."""
    w, h = int(size[0]), int(size[1])
    s = image_size / max(w, h)
    return max(1, round(w * s)), max(1, round(h * s))


def _map(v: int, src: int, dst: int) -> int:
    # the pixel of the destination grid that holds the centre of source pixel v
    return int(min(dst - 1, max(0, math.floor((v + 0.5) * dst / src))))


def to_original(point: Point, shown: Sequence[int], original: Sequence[int]) -> Point:
    """A shown pixel (pixel-centre mapping, clamped to the image) in original pixels."""
    return _map(point[0], shown[0], original[0]), _map(point[1], shown[1], original[1])


def to_display(point: Point, original: Sequence[int], shown: Sequence[int]) -> Point:
    """An original pixel in shown pixels (the inverse mapping of :func:`to_original`)."""
    return _map(point[0], original[0], shown[0]), _map(point[1], original[1], shown[1])


def resize_for_display(image: Image.Image, image_size: int) -> Image.Image:
    """The image as the model sees it (long side ``image_size``, bilinear)."""
    size = display_size(image.size, image_size)
    return image if size == image.size else image.resize(size, Image.BILINEAR)


def zoom_crop(image: Image.Image, center: Point, half: int, out_size: int, dot: bool = False) -> Image.Image:
    """The ``2*half`` square of ``image`` (original pixels) centred on ``center``, padded with
    PAD_COLOUR outside the image, resized to ``out_size`` x ``out_size``; ``dot`` marks the centre.

    The original pixel ``center`` lands at output pixel ``out_size // 2`` (up to resampling).
    """
    cx, cy = int(center[0]), int(center[1])
    box = (cx - half, cy - half, cx + half, cy + half)
    canvas = Image.new("RGB", (2 * half, 2 * half), PAD_COLOUR)
    W, H = image.size
    inner = (max(0, box[0]), max(0, box[1]), min(W, box[2]), min(H, box[3]))
    if inner[0] < inner[2] and inner[1] < inner[3]:
        canvas.paste(image.crop(inner), (inner[0] - box[0], inner[1] - box[1]))
    out = canvas.resize((out_size, out_size), Image.BILINEAR)
    if dot:
        c, rad = out_size // 2, max(1, out_size // 80)
        ImageDraw.Draw(out).ellipse([c - rad, c - rad, c + rad, c + rad], fill=DOT_COLOUR)
    return out
