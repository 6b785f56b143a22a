"""The SVG reconstruction env (VAGEN's SVG task): see :mod:`vagent.envs.svg.env` and docs/envs_svg.md.

Modules: ``env`` (SVGEnv and its config), ``replies`` (the reply parser), ``prompts`` (system
prompt, format reminder, feedback), ``shapes`` (targets from the seed or SVG files, their ground
truth and descriptions), ``render`` (guarded rasterisation) with ``cairo_worker`` (cairosvg in a
worker process), ``pil_render`` (the PIL fallback) and ``attributes`` (SVG attribute parsing),
``similarity`` (pixel, SSIM, edge IoU, optional features), ``render_worker`` (the worker
process's main).
"""

from vagent.envs.svg.env import LEGEND, SVGConfig, SVGEnv, describe_state, extract_svg, parse_svg_response

__all__ = ["SVGEnv", "SVGConfig", "describe_state", "extract_svg", "parse_svg_response", "LEGEND"]
