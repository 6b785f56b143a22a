"""Safe SVG rasterisation for the SVG env: static guards, cairosvg in a worker process, a PIL fallback.

Model-written SVG is untrusted input. :func:`render_svg` never raises on any text; it returns a
:class:`RenderResult` whose ``error`` says why nothing could be rendered. Guards, in order:

1. size: at most ``limits.max_chars`` characters (checked before parsing);
2. no DTD (``<!DOCTYPE``/``<!ENTITY``: entity expansion attacks), well-formed XML, an ``<svg>`` root;
3. at most ``max_elements`` elements, ``max_depth`` nesting levels and ``max_use`` ``<use>``
   elements (each ``<use>`` can multiply the drawing work);
4. no file or network access: every ``href``/``url(...)``/``@import``/``xml-stylesheet`` that does
   not point inside the document (``#id``) is listed in ``refused_refs`` and never fetched
   (cairosvg gets a fetcher that returns an empty image for every URL, ``data:`` URLs included);
   the drawing goes on without the resource;
5. time and memory: with ``limits.timeout_s > 0`` cairosvg runs in a persistent worker process
   (one per Python process, shared by all envs, behind a lock; ``vagent.envs.svg.render_worker``)
   limited to ``max_memory_mb`` of address space; a render that exceeds the timeout kills the
   worker (it is restarted on the next render) and fails with "render timed out". A forked child
   starts its own worker. The worker dies with this process (``PR_SET_PDEATHSIG`` and a parent
   watchdog) and enforces the timeout itself too (a watchdog and ``RLIMIT_CPU``), so a SIGKILLed
   server or trainer leaves no render running. The pil renderer checks the timeout per element. With ``timeout_s == 0`` cairosvg runs in this process (no timeout, for
   trusted input; about as fast: the worker adds ~0.1 ms per render).

Renderers: ``cairosvg`` (needs the system cairo library: ``apt-get install -y libcairo2``) or
``pil``, our own rasteriser of the simple subset (rect, circle, ellipse, line, polyline, polygon
and ``g`` with fill/stroke/stroke-width/opacity attributes or ``style``, ``viewBox`` scaling; 4x
supersampled); anything else is skipped and listed in ``RenderResult.notes``. ``"auto"`` picks
cairosvg when it imports and otherwise pil, with a warning (a named fallback, never silent).

Output: an RGB image of ``width`` x ``height``; transparent areas are white.

This module holds the guards, the renderer choice and :func:`render_svg`; the cairosvg worker
client is in :mod:`vagent.envs.svg.cairo_worker`, the PIL renderer in
:mod:`vagent.envs.svg.pil_render` and the attribute parsing they share in
:mod:`vagent.envs.svg.attributes` (their public names are importable from here too).
"""

from __future__ import annotations

import io
import re
import warnings
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from typing import Any

from PIL import Image

from vagent.envs.svg.attributes import (  # noqa: F401 - re-exported: the public names of this module
    element_style, local_name, parse_colour, parse_length, parse_points, svg_canvas,
)
from vagent.envs.svg.cairo_worker import _WORKER, RendererUnavailable, _describe_exception, cairosvg_png, worker_starts
from vagent.envs.svg.pil_render import on_white, pil_render

RENDERERS = ("auto", "cairosvg", "pil")
#: how much of each refused reference ``refused_refs`` keeps (its first characters: a data: URL or a
#: long path is cut, so the list stays short whatever the SVG holds)
MAX_REF_CHARS = 80
_URL_IN_CSS = re.compile(r"url\(\s*['\"]?([^'\")]*)['\"]?\s*\)", re.IGNORECASE)
_IMPORT_IN_CSS = re.compile(r"@import\s+(?:url\()?\s*['\"]?([^'\")\s;]*)", re.IGNORECASE)


@dataclass(frozen=True)
class RenderLimits:
    """Guards against hostile or broken SVG (see the module docstring)."""

    max_chars: int = 32_768
    max_elements: int = 2_000
    max_depth: int = 32
    max_use: int = 32
    #: seconds per render in the worker process; 0 = render in this process without a timeout
    timeout_s: float = 5.0
    #: address-space limit of the worker process in MiB (0 = none)
    max_memory_mb: int = 1024


@dataclass(frozen=True)
class RenderResult:
    """One rasterisation: ``image`` (RGB) or ``error`` (why not), never both.

    ``refused_refs``: external references that were not loaded; ``notes``: what the renderer
    skipped (pil fallback); ``renderer``: which renderer ran.
    """

    image: Image.Image | None
    error: str | None
    renderer: str
    refused_refs: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.image is not None


# ---------------------------------------------------------------------------------------------
# Renderer choice
# ---------------------------------------------------------------------------------------------

_CAIRO_STATUS: dict[str, Any] = {}


def cairosvg_available() -> tuple[bool, str]:
    """(importable?, the import error) of cairosvg; cached per process."""
    if "ok" not in _CAIRO_STATUS:
        try:
            import cairosvg  # noqa: F401
        except Exception as exc:  # noqa: BLE001 - OSError when libcairo is missing, ImportError otherwise
            _CAIRO_STATUS.update(ok=False, error=f"{type(exc).__name__}: {exc}")
        else:
            _CAIRO_STATUS.update(ok=True, error="")
    return _CAIRO_STATUS["ok"], _CAIRO_STATUS["error"]


def resolve_renderer(name: str) -> str:
    """``"auto"`` -> ``"cairosvg"`` if it imports, else ``"pil"`` (with a warning); ``"cairosvg"``
    when it cannot import raises ValueError naming the fix."""
    if name not in RENDERERS:
        raise ValueError(f"unknown SVG renderer {name!r}; valid: {', '.join(RENDERERS)}.")
    if name == "pil":
        return "pil"
    ok, err = cairosvg_available()
    if ok:
        return "cairosvg"
    if name == "cairosvg":
        raise ValueError(f"renderer='cairosvg' but cairosvg does not import ({err}). Fix: `pip install cairosvg` "
                         "and the system cairo library (`apt-get install -y libcairo2`), or use renderer='pil'.")
    warnings.warn(f"cairosvg does not import ({err}); the SVG env falls back to its own PIL renderer of the "
                  "simple SVG subset (renderer='pil'). Install cairosvg + libcairo2 for full SVG.", stacklevel=2)
    return "pil"


# ---------------------------------------------------------------------------------------------
# Static guards
# ---------------------------------------------------------------------------------------------

def _external(ref: str) -> bool:
    ref = ref.strip()
    return bool(ref) and not ref.startswith("#")


def check_svg(svg: str, limits: RenderLimits) -> tuple[ET.Element | None, str | None, tuple[str, ...]]:
    """(parsed root, error, refused external references) of ``svg`` under ``limits``. Pure."""
    if len(svg) > limits.max_chars:
        return None, (f"the SVG has {len(svg)} characters, more than the limit of {limits.max_chars}; "
                      "write a shorter SVG"), ()
    head = svg[:4096].lower()
    if "<!doctype" in svg.lower() or "<!entity" in head:
        return None, "DTDs and entities (<!DOCTYPE ...>, <!ENTITY ...>) are not allowed; remove them", ()
    try:
        root = ET.fromstring(svg)
    except ET.ParseError as exc:
        return None, f"the SVG is not well-formed XML ({exc})", ()
    except (ValueError, RecursionError, MemoryError) as exc:
        return None, f"the SVG could not be parsed ({type(exc).__name__})", ()
    if local_name(root.tag) != "svg":
        return None, f"the root element is <{local_name(root.tag) or '?'}>, expected <svg>", ()
    n, n_use, refused = 0, 0, []
    stack = [(root, 1)]
    while stack:
        el, depth = stack.pop()
        n += 1
        if n > limits.max_elements:
            return None, f"the SVG has more than {limits.max_elements} elements; simplify it", ()
        if depth > limits.max_depth:
            return None, f"elements are nested deeper than {limits.max_depth} levels; flatten the SVG", ()
        name = local_name(el.tag)
        if name == "use":
            n_use += 1
            if n_use > limits.max_use:
                return None, f"the SVG has more than {limits.max_use} <use> elements; draw shapes directly", ()
        for key, value in el.attrib.items():
            if local_name(key) == "href" and _external(value):
                refused.append(value)
            elif "url(" in value.lower():
                refused += [u for u in _URL_IN_CSS.findall(value) if _external(u)]
        if name == "style" and el.text:
            refused += [u for u in _URL_IN_CSS.findall(el.text) if _external(u)]
            refused += [u for u in _IMPORT_IN_CSS.findall(el.text) if _external(u)]
        stack.extend((child, depth + 1) for child in el)
    if "xml-stylesheet" in svg[:4096]:
        refused.append("<?xml-stylesheet?>")
    return root, None, tuple(dict.fromkeys(r[:MAX_REF_CHARS] for r in refused))


# ---------------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------------

def render_svg(svg: str, width: int, height: int, renderer: str = "cairosvg",
               limits: RenderLimits | None = None) -> RenderResult:
    """Rasterise untrusted ``svg`` to an RGB ``width`` x ``height`` image; never raises on any text
    (only :class:`RendererUnavailable` when the cairosvg worker cannot start: not the SVG's fault).

    ``renderer``: "cairosvg" or "pil" (resolve "auto" first with :func:`resolve_renderer`)."""
    limits = limits or RenderLimits()
    if not isinstance(svg, str):
        return RenderResult(None, f"the SVG is not text (got {type(svg).__name__})", renderer)
    root, error, refused = check_svg(svg, limits)
    if error is not None:
        return RenderResult(None, error, renderer)
    if renderer == "pil":
        try:
            image, notes = pil_render(root, width, height, limits.timeout_s)
        except TimeoutError:
            return RenderResult(None, f"render timed out after {limits.timeout_s:g} s; draw fewer or simpler shapes",
                                renderer, refused)
        except (ValueError, TypeError, OverflowError, MemoryError, ZeroDivisionError) as exc:
            return RenderResult(None, f"the SVG could not be rendered ({_describe_exception(exc)})", renderer, refused)
        return RenderResult(image, None, renderer, refused, notes)
    data = svg.encode("utf-8", errors="replace")
    if limits.timeout_s > 0:
        png, error = _WORKER.render(data, width, height, limits.timeout_s, limits.max_memory_mb)
    else:
        try:
            png, error = cairosvg_png(data, width, height), None
        except Exception as exc:  # noqa: BLE001 - cairosvg raises many types on bad input
            png, error = None, f"the SVG could not be rendered ({_describe_exception(exc)})"
    if error is not None:
        return RenderResult(None, error, renderer, refused)
    try:
        image = on_white(Image.open(io.BytesIO(png)))
    except Exception as exc:  # noqa: BLE001 - a corrupt PNG from the renderer
        return RenderResult(None, f"the rendered image could not be decoded ({_describe_exception(exc)})", renderer, refused)
    if image.size != (width, height):
        image = image.resize((width, height), Image.Resampling.BILINEAR)
    return RenderResult(image, None, renderer, refused)


__all__ = ["RENDERERS", "RenderLimits", "RenderResult", "RendererUnavailable", "cairosvg_available", "resolve_renderer", "check_svg",
           "render_svg", "pil_render", "cairosvg_png", "worker_starts", "local_name", "parse_length",
           "parse_points", "parse_colour", "element_style", "svg_canvas", "on_white"]
