"""What the SVG env says: its system prompt, the format reminder, the example reply, the feedback
line after an attempt and the side-by-side feedback image.

Pure functions of the config and the turn's results (see :mod:`vagent.envs.svg.env`).
"""

from __future__ import annotations

from typing import Mapping

from PIL import Image

from vagent.envs.formats import FormatExample, render_response
from vagent.envs.svg.config import SVGConfig
from vagent.envs.svg.render import RenderResult
from vagent.envs.svg.replies import ParsedSVG
from vagent.envs.svg.shapes import LEGEND, PALETTE, Shape, Target, describe_target_state, make_state, target_svg


def system_prompt_text(cfg: SVGConfig, from_files: bool, reminder: str) -> str:
    """The system prompt; ``from_files``: targets come from ``svg_dir`` (their canvas size varies)."""
    size = cfg.canvas_size
    lines = [
        "You are an SVG artist. You see a target image and write SVG code that reproduces it as closely as possible.",
        (f"The target is drawn on a {size} x {size} canvas: write <svg xmlns=\"http://www.w3.org/2000/svg\" "
         f"width=\"{size}\" height=\"{size}\" viewBox=\"0 0 {size} {size}\"> ... </svg> (x to the right, y down). "
         if not from_files else "Each observation gives the target's canvas size W x H: write <svg "
         "xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 W H\"> ... </svg> (x to the right, y down). ")
        + "Simple shapes (rect, circle, ellipse, line, polygon) with fill and stroke colours are enough.",
        f"You have {cfg.max_turns} attempt(s). After each attempt you see the target and the rendering of your SVG, "
        f"with its similarity score in [0, 1]; revise your SVG to raise it. The episode ends when the similarity "
        f"reaches {cfg.success_threshold:g} or after the last attempt.",
        f"Rules: at most {cfg.max_svg_chars} characters and {cfg.max_svg_elements} elements; external files and URLs "
        "are never loaded; malformed SVG scores 0.",
    ]
    if cfg.render == "text":
        lines.append("The target is described in words with its exact geometry instead of an image.")
    third = "third" if cfg.grid_size == 3 else f"1/{cfg.grid_size}"
    lines.append(f"Positions are relative to the canvas centre: a shape whose centre is in the middle {third} "
                 "of the height is in the same row as the centre, otherwise above or below it; likewise the middle "
                 f"{third} of the width is the same column, otherwise left or right.")
    if cfg.description_style == "symbolic":
        lines.append(f"Symbolic descriptions are a {cfg.grid_size} x {cfg.grid_size} grid of the canvas, one row per "
                     f"line, with the legend: {LEGEND}.")
    lines.append(reminder)
    lines.append("Example reply:")
    lines.append(render_response(cfg.format, format_example(cfg.canvas_size, cfg.grid_size, cfg.description_style)))
    return "\n".join(lines)


def format_reminder(cfg: SVGConfig) -> str:
    """The format reminder that ends every observation: the reply template and what each field holds."""
    template = render_response(cfg.format, {k: "..." for k in ("think", "observation", "reasoning", "prediction", "answer")})
    parts = [f"Answer in the format: {template}."]
    if "<observation>" in template:
        parts.append("<observation> describes the target: each shape, its colour and where it is relative to the canvas centre.")
    if "<reasoning>" in template:
        parts.append("<reasoning> explains how you will draw it.")
    if "<prediction>" in template:
        parts.append("<prediction> describes the shapes your SVG will draw and where, relative to the canvas centre.")
    if "<observation>" in template or "<prediction>" in template:
        parts.append({
            "natural": "Describe positions in words: above/below or in the same row as the centre, left/right or in the same column.",
            "structured": 'Describe shapes as a JSON list such as [{"object": "circle", "colour": "red", '
                          '"vertical": "above", "horizontal": "left"}].',
            "symbolic": "Describe shapes as the position grid, one row per line, using the legend.",
        }[cfg.description_style])
    parts.append("<answer> holds one complete SVG document: <svg ...>...</svg>.")
    return " ".join(parts)


def format_example(size: int, grid_size: int, style: str) -> FormatExample:
    """The example reply of the system prompt: a red circle and a blue square on a ``size`` canvas."""
    c = size // 2
    r = max(4, size // 8)
    shapes = (Shape("circle", "red", PALETTE["red"], (("cx", str(size // 6)), ("cy", str(size // 6)), ("r", str(r))),
                    (size // 6 - r, size // 6 - r, size // 6 + r, size // 6 + r)),
              Shape("rectangle", "blue", PALETTE["blue"],
                    (("x", str(c - r)), ("y", str(size - 3 * r)), ("width", str(2 * r)), ("height", str(2 * r))),
                    (c - r, size - 3 * r, c + r, size - r)))
    example = Target(float(size), float(size), "white", "#ffffff", shapes, target_svg(size, size, "#ffffff", shapes))
    state = make_state(example, grid_size)
    description = describe_target_state(state, style)
    return FormatExample(
        observation=description,
        reasoning="I draw the white background first, then each shape with its colour and position.",
        prediction=description,
        answer=example.svg,
    )


def feedback_line(ps: ParsedSVG, result: RenderResult | None, scores: Mapping[str, float], best: float,
                  turns_left: int, success_threshold: float) -> str:
    """The feedback on an attempt: render status, similarity and its components, best so far, attempts left."""
    tail = f" {turns_left} attempt(s) left." if turns_left > 0 else " No attempts left."
    if ps.svg is None:
        return f"Last reply: {ps.error}; nothing was rendered; similarity 0.{tail}"
    refused = ""
    if result is not None and result.refused_refs:
        refused = f" External references were not loaded: {', '.join(result.refused_refs[:3])}."
    if not scores:
        return f"Last reply: your SVG could not be rendered: {result.error}; similarity 0.{refused}{tail}"
    if scores["score"] >= success_threshold:
        tail = " The episode is over."
    names = {"pixel": "pixels", "ssim": "structure", "edge": "edges", "feature": "features"}
    parts = ", ".join(f"{names[k]} {scores[k]:.2f}" for k in names if k in scores)
    status = " Success!" if scores["score"] >= success_threshold else ""
    return (f"Last reply: your SVG rendered; similarity {scores['score']:.3f} ({parts}); best so far {best:.3f}; "
            f"success needs {success_threshold:g}.{status}{refused}{tail}")


def side_by_side(left: Image.Image, right: Image.Image, gap: int = 4) -> Image.Image:
    """One RGB image: ``left``, a grey gap, ``right``."""
    w, h = left.size
    out = Image.new("RGB", (2 * w + gap, h), (90, 90, 90))
    out.paste(left, (0, 0))
    out.paste(right.resize((w, h)), (w + gap, 0))
    return out


__all__ = ["system_prompt_text", "format_reminder", "format_example", "feedback_line", "side_by_side"]
