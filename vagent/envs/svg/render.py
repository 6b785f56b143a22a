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
"""

from __future__ import annotations

import atexit
import concurrent.futures
import io
import json
import os
import queue
import re
import select
import struct
import subprocess
import sys
import threading
import time
import warnings
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from typing import Any

from PIL import Image, ImageColor, ImageDraw

from vagent.envs.base import EnvError

RENDERERS = ("auto", "cairosvg", "pil")
_EMPTY_SVG = b'<svg xmlns="http://www.w3.org/2000/svg" width="1" height="1"></svg>'
_START_TIMEOUT_S = 60.0  # the worker imports cairosvg before it is ready
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

def local_name(tag: Any) -> str:
    """``{namespace}name`` -> ``name`` (comments and processing instructions -> "")."""
    if not isinstance(tag, str):
        return ""
    return tag.rsplit("}", 1)[-1]


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
                refused.append(value[:80])
            elif "url(" in value.lower():
                refused += [u[:80] for u in _URL_IN_CSS.findall(value) if _external(u)]
        if name == "style" and el.text:
            refused += [u[:80] for u in _URL_IN_CSS.findall(el.text) if _external(u)]
            refused += [u[:80] for u in _IMPORT_IN_CSS.findall(el.text) if _external(u)]
        stack.extend((child, depth + 1) for child in el)
    if "xml-stylesheet" in svg[:4096]:
        refused.append("<?xml-stylesheet?>")
    return root, None, tuple(dict.fromkeys(refused))


def on_white(image: Image.Image) -> Image.Image:
    """Composite an RGBA image onto white and return RGB."""
    image = image.convert("RGBA")
    base = Image.new("RGBA", image.size, (255, 255, 255, 255))
    base.alpha_composite(image)
    return base.convert("RGB")


# ---------------------------------------------------------------------------------------------
# cairosvg (in process, and the worker process)
# ---------------------------------------------------------------------------------------------

def _refuse_fetch(url: str, resource_type: str) -> bytes:  # noqa: ARG001 - cairosvg's fetcher signature
    """cairosvg url_fetcher: nothing is ever fetched (file, network or data: URLs)."""
    return _EMPTY_SVG


def cairosvg_png(svg: bytes, width: int, height: int) -> bytes:
    """PNG bytes of ``svg`` rendered by cairosvg at ``width`` x ``height`` with no URL access.

    Percent sizes resolve against the output size. Raises whatever cairosvg raises."""
    from cairosvg.surface import PNGSurface

    return PNGSurface.convert(bytestring=svg, output_width=width, output_height=height, parent_width=width,
                              parent_height=height, unsafe=False, url_fetcher=_refuse_fetch)


def _describe_exception(exc: BaseException) -> str:
    msg = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {msg}" if msg else type(exc).__name__


class RendererUnavailable(EnvError):
    """The renderer itself cannot run (the worker does not start): an environment error, not the SVG's fault."""


class _Spawner:
    """Starts render workers from one long-lived daemon thread.

    The worker asks the kernel for SIGKILL when its parent dies (``PR_SET_PDEATHSIG``), and Linux
    counts the *thread* that forked it as the parent: a worker started from a pool thread (the
    env server runs envs in anyio's threads, which exit when idle) would be killed when that
    thread exits. Forking from this thread, which lives as long as the process, ties the
    worker's life to the process.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.jobs: queue.SimpleQueue | None = None

    def popen(self, cmd: list[str], **kwargs: Any) -> subprocess.Popen:
        with self.lock:
            if self.jobs is None:
                self.jobs = queue.SimpleQueue()
                threading.Thread(target=self._serve, args=(self.jobs,), name="svg-render-spawner", daemon=True).start()
            jobs = self.jobs
        done: concurrent.futures.Future = concurrent.futures.Future()
        jobs.put((done, cmd, kwargs))
        return done.result()

    @staticmethod
    def _serve(jobs: queue.SimpleQueue) -> None:
        while True:
            done, cmd, kwargs = jobs.get()
            try:
                done.set_result(subprocess.Popen(cmd, **kwargs))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                done.set_exception(exc)


_SPAWNER = _Spawner()


class _Worker:
    """A persistent ``render_worker`` subprocess speaking length-prefixed frames on stdin/stdout.

    Request: ``>II`` (header length, svg length) + JSON header ``{"w", "h"}`` + svg bytes.
    Reply: ``>II`` (header length, png length) + JSON header ``{"error"}`` + png bytes.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.proc: subprocess.Popen | None = None
        self.memory_mb = 0
        self.starts = 0

    def _start(self, memory_mb: int) -> subprocess.Popen:
        """Start the worker and wait for its ready frame (it imports cairosvg first); raises
        RendererUnavailable if it cannot start."""
        cmd = [sys.executable, "-m", "vagent.envs.svg.render_worker", "--max-memory-mb", str(memory_mb),
               "--parent-pid", str(os.getpid())]
        env = dict(os.environ)  # the worker imports this very vagent, however this process found it
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
        self.proc = _SPAWNER.popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                   env=env)
        self.memory_mb = memory_mb
        self.starts += 1
        try:
            meta, _ = self._read_frame(time.monotonic() + _START_TIMEOUT_S)
        except EOFError:
            meta = None
        if meta is None or meta.get("error"):
            self.kill()
            why = meta.get("error") if meta else f"no ready frame within {_START_TIMEOUT_S:g} s"
            raise RendererUnavailable(
                f"the SVG render worker failed to start ({why}); check `{sys.executable} -m "
                "vagent.envs.svg.render_worker` runs, install cairosvg + libcairo2, or use renderer='pil'")
        return self.proc

    def kill(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
        if proc is not None:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:  # pragma: no cover - a killed process always exits
                pass
            for stream in (proc.stdin, proc.stdout):
                try:
                    stream.close()
                except OSError:
                    pass

    def _read_exact(self, fd: int, n: int, deadline: float) -> bytes | None:
        chunks, got = [], 0
        while got < n:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                return None
            chunk = os.read(fd, min(n - got, 1 << 20))
            if not chunk:
                raise EOFError("the render worker exited")
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    def _read_frame(self, deadline: float) -> tuple[dict | None, bytes]:
        """(header, payload) of the next frame, or (None, b"") at the deadline; EOFError if the
        worker exited."""
        fd = self.proc.stdout.fileno()
        head = self._read_exact(fd, 8, deadline)
        if head is None:
            return None, b""
        n_header, n_payload = struct.unpack(">II", head)
        body = self._read_exact(fd, n_header + n_payload, deadline)
        if body is None:
            return None, b""
        return json.loads(body[:n_header]), body[n_header:]

    def render(self, svg: bytes, width: int, height: int, timeout_s: float, memory_mb: int) -> tuple[bytes | None, str | None]:
        """(png, None) or (None, error)."""
        with self.lock:
            if self.proc is None or self.proc.poll() is not None or self.memory_mb != memory_mb:
                self.kill()
                self._start(memory_mb)
            header = json.dumps({"w": width, "h": height, "timeout_s": timeout_s}).encode()
            try:
                self.proc.stdin.write(struct.pack(">II", len(header), len(svg)) + header + svg)
                self.proc.stdin.flush()
                meta, png = self._read_frame(time.monotonic() + timeout_s)
            except (OSError, EOFError, ValueError) as exc:
                self.kill()
                return None, f"the renderer crashed on this SVG ({type(exc).__name__}); simplify it"
            if meta is None:
                self.kill()
                return None, f"render timed out after {timeout_s:g} s; draw fewer or simpler shapes"
            if meta.get("error"):
                return None, str(meta["error"])
            return png, None


_WORKER = _Worker()
atexit.register(_WORKER.kill)


def _forget_worker_after_fork() -> None:
    """A forked child must not talk to its parent's worker (their frames would interleave): it
    drops the handle (without killing the parent's worker) and starts its own on first use."""
    _WORKER.lock = threading.Lock()
    _WORKER.proc = None
    _SPAWNER.lock = threading.Lock()
    _SPAWNER.jobs = None  # the spawner thread does not exist in the child


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_worker_after_fork)


def worker_starts() -> int:
    """How many times this process started the render worker (a restart follows a timeout or crash)."""
    return _WORKER.starts


# ---------------------------------------------------------------------------------------------
# The PIL fallback renderer of the simple subset
# ---------------------------------------------------------------------------------------------

_SUPERSAMPLE = 4
_SHAPES = ("rect", "circle", "ellipse", "line", "polyline", "polygon")
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


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
