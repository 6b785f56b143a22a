"""Serve the viewer on loopback, or write it as one self-contained HTML file.

The page is ``static/index.html`` + ``dom.js`` (the helpers both pages share) + ``viewer.js`` +
``viewer.css`` (plain HTML/JS written for vagent, no third-party code, nothing fetched from elsewhere).
Served, it asks this small JSON API (all GET, loopback only; every URL in the page is relative, so the page works under a prefix)::

    /api/index                       groups, RL steps, validation points (data.py: index())
    /api/episodes?group=G            the group's episode summaries (filtering/sorting/paging in the page)
    /api/episode?group=G&i=N         one episode: turns, reward parts, token rows
    /files/<path>                    a frame (PNG) inside the directory

Every answer to a request is a page or JSON: a missing thing is 404 ``{"error"}``, a file of the
directory the viewer cannot read is 422 ``{"error"}`` naming the file and line (``data.BadFile``).
Only requests addressed to the viewer's own names are answered (``Host`` header 127.0.0.1,
localhost or [::1], any port, or a name passed with ``--allow-host``); any other Host gets 403,
so a web page that re-points its own domain name at 127.0.0.1 (DNS rebinding) cannot read the run.

A sweep directory (``sweep.py``) is served as ``static/sweep.html`` + ``dom.js`` + ``sweep.js`` with::

    /api/sweep                       the report's tables, curves and trials (sweep.py: index())
    /curves/curves_<metric>.png      a validation curve, drawn as vagent sweep report draws it
    /trial/<row>/seed_<k>/...        that trial's run directory in the run viewer above (its API
                                     under the prefix; its index carries a link back to the sweep)

Written (``--out FILE``), the same page carries all three documents and every frame (as data:
URIs) in a ``<script type="application/json">`` block, and the page reads them from there; a
sweep's page carries its document and the curves, and lists each trial's run directory.
"""

from __future__ import annotations

import base64
import json
import mimetypes
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union
from urllib.parse import parse_qs, unquote, urlparse

from vagent.authority import host_name
from vagent.viewer.data import ViewerError

if TYPE_CHECKING:
    from vagent.viewer.data import EvalSource, RunSource
    from vagent.viewer.sweep import SweepSource

    #: what a viewer serves: a run or evaluation directory, or a sweep directory
    Source = Union[RunSource, EvalSource, SweepSource]

#: the Host names the viewer answers to, besides those passed with ``--allow-host``
LOCAL_HOSTS = ("127.0.0.1", "localhost", "[::1]")

STATIC = Path(__file__).parent / "static"
_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
          ".css": "text/css; charset=utf-8"}


#: one curve request at a time: the page asks for its curves at once, one drawing serves them all
#: (SweepSource caches it) and pyplot is not thread-safe; unlocked, each request drew every curve
_CURVES_LOCK = threading.Lock()


def _json_bytes(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":"), allow_nan=False).encode()


class _Redirect(Exception):
    """Answer 301 to ``location`` (a trial's prefix without its closing slash)."""


def _run_route(source: RunSource | EvalSource, path: str, q: dict[str, str], extra_index: dict | None = None) -> tuple[bytes, str]:
    """(body, content type) of a run or evaluation viewer's ``path`` (module docstring); ViewerError: 404."""
    if path in ("/", "/index.html"):
        return (STATIC / "index.html").read_bytes(), _TYPES[".html"]
    if path.startswith("/static/"):
        return _static(path.removeprefix("/static/"))
    if path == "/api/index":
        return _json_bytes({**source.index(), **(extra_index or {})}), "application/json"
    if path == "/api/episodes":
        return _json_bytes(source.episodes(q.get("group", ""))), "application/json"
    if path == "/api/episode":
        i = q.get("i", "")
        if not i.lstrip("-").isdigit():
            raise ViewerError(f"episode index i={i!r}: expected an integer, e.g. /api/episode?group=step_000010&i=0")
        return _json_bytes(source.episode(q.get("group", ""), int(i))), "application/json"
    if path.startswith("/files/"):
        file = source.file(unquote(path.removeprefix("/files/")))
        return file.read_bytes(), mimetypes.guess_type(file.name)[0] or "application/octet-stream"
    raise ViewerError(f"no such page {path!r}")


def _static(name: str) -> tuple[bytes, str]:
    path = STATIC / name
    if "/" in name or not path.is_file():
        raise ViewerError(f"no static file {name!r}")
    return path.read_bytes(), _TYPES.get(path.suffix, "application/octet-stream")


def _sweep_route(sweep: SweepSource, path: str, q: dict[str, str]) -> tuple[bytes, str]:
    """The sweep page's ``path``: ``/`` (sweep.html), ``/api/sweep``, ``/curves/<png>``, and a trial's
    run viewer under ``/trial/<row>/seed_<k>/`` (its own ``/``, ``/api/...``, ``/files/...``)."""
    if path in ("/", "/index.html"):
        return (STATIC / "sweep.html").read_bytes(), _TYPES[".html"]
    if path.startswith("/static/"):
        return _static(path.removeprefix("/static/"))
    if path == "/api/sweep":
        return _json_bytes(sweep.index()), "application/json"
    if path.startswith("/curves/"):
        with _CURVES_LOCK:
            return sweep.curve_png(unquote(path.removeprefix("/curves/"))), "image/png"
    if path.startswith("/trial/"):
        parts = path.removeprefix("/trial/").split("/", 2)  # <row>, seed_<k>, the run viewer's path
        if len(parts) < 2:
            raise ViewerError(f"no such page {path!r}: a trial's viewer is /trial/<row>/seed_<k>/")
        trial_id = f"{unquote(parts[0])}/{unquote(parts[1])}"
        if len(parts) == 2:
            sweep.trial(trial_id)  # 404 unless it is a trial with a run directory
            raise _Redirect(path + "/")
        sub = "/" + parts[2]
        source = sweep.trial(trial_id, fresh=sub in ("/", "/index.html", "/api/index"))
        back = {"back": {"href": "../../../", "label": f"sweep {sweep.title}", "trial": trial_id}}
        return _run_route(source, sub, q, back)
    raise ViewerError(f"no such page {path!r}")


class _Handler(BaseHTTPRequestHandler):
    source: Any = None  # set on the subclass made by make_server
    allowed_hosts: frozenset[str] = frozenset(LOCAL_HOSTS)

    def log_message(self, fmt: str, *args: object) -> None:  # quiet: the command prints the URL once
        pass

    def _send(self, code: int, body: bytes, ctype: str, location: str | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        if location:
            self.send_header("Location", location)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        host = self.headers.get("Host")
        if host_name(host) not in self.allowed_hosts:
            names = ", ".join(sorted(self.allowed_hosts))
            self._send(403, _json_bytes({"error": f"Host {host!r} is not a name of this viewer ({names}): requests "
                                                  "addressed to another name are refused, so that a web page cannot "
                                                  "read the run through DNS rebinding. To open the viewer under "
                                                  "another name (a proxy, an SSH tunnel to a named host), pass "
                                                  "vagent view --allow-host NAME."}), "application/json")
            return
        url = urlparse(self.path)
        q = {k: v[0] for k, v in parse_qs(url.query).items()}
        route = _sweep_route if getattr(self.source, "kind", "") == "sweep" else _run_route
        try:
            body, ctype = route(self.source, url.path, q)
            self._send(200, body, ctype)
        except _Redirect as moved:
            self._send(301, b"", "text/plain", location=str(moved))
        except ValueError as exc:  # ViewerError: 404 not found, 422 a file the viewer cannot read (BadFile)
            self._send(getattr(exc, "status", 404), _json_bytes({"error": str(exc)}), "application/json")
        except Exception as exc:  # noqa: BLE001 - a viewer bug: still an answer, never a closed connection
            self._send(500, _json_bytes({"error": f"vagent view failed on {url.path}: {type(exc).__name__}: {exc}"}),
                       "application/json")


def make_server(source: Source, port: int = 8765, allow_hosts: tuple[str, ...] = ()) -> ThreadingHTTPServer:
    """An HTTP server for ``source`` on 127.0.0.1:``port`` (0: any free port); not yet serving.

    allow_hosts: Host names answered besides :data:`LOCAL_HOSTS` (the module docstring says why)."""
    allowed = frozenset(LOCAL_HOSTS) | {host_name(h) for h in allow_hosts}
    handler = type("Handler", (_Handler,), {"source": source, "allowed_hosts": allowed})
    server = ThreadingHTTPServer(("127.0.0.1", port), handler)
    server.daemon_threads = True
    return server


def serve_in_thread(source: Source, port: int = 0, allow_hosts: tuple[str, ...] = ()) -> tuple[ThreadingHTTPServer, str]:
    """Start serving in a daemon thread; returns (server, base URL). ``server.shutdown()`` stops it."""
    server = make_server(source, port, allow_hosts)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


def _data_uri(path: Path, data: bytes | None = None) -> str:
    """``path``'s bytes (or ``data``, typed by ``path``'s name) as a data: URI."""
    ctype = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
    return f"data:{ctype};base64,{base64.b64encode(path.read_bytes() if data is None else data).decode()}"


def static_html(source: RunSource | EvalSource, max_episodes: int | None = None) -> str:
    """The self-contained page: HTML, CSS, JS, the documents and frames inline (see the module docstring).

    max_episodes: at most this many episodes per group (the first ones); None = all.
    """
    index = source.index()
    episodes: dict[str, list[dict]] = {}
    details: dict[str, dict[str, dict]] = {}
    files: dict[str, str | None] = {}
    for g in index["groups"]:
        summaries = source.episodes(g["id"])
        if max_episodes is not None:
            summaries = summaries[:max_episodes]
        episodes[g["id"]] = summaries
        details[g["id"]] = {}
        for s in summaries:
            doc = source.episode(g["id"], s["i"])
            details[g["id"]][str(s["i"])] = doc
            for rel in [im for t in doc["turns"] for im in t["images"]] + doc["final_images"]:
                if rel not in files:
                    try:
                        files[rel] = _data_uri(source.file(rel))
                    except ViewerError:  # a frame the size cap kept off the disk: the page says so
                        files[rel] = None
    return _inline(STATIC / "index.html", "viewer.js",
                   {"index": index, "episodes": episodes, "details": details, "files": files})


def static_sweep_html(sweep: SweepSource) -> str:
    """The sweep's self-contained page: its document with the curves as data: URIs inline."""
    index = sweep.index()
    curves = {c["file"]: _data_uri(Path(c["file"]), sweep.curve_png(Path(c["file"]).name)) for c in index["curves"]}
    return _inline(STATIC / "sweep.html", "sweep.js", {"sweep": index, "files": curves})


def embed_json(data: object) -> str:
    """``data`` as JSON that is safe inside ``<script type="application/json">`` whatever its strings
    hold: every ``<``, ``>`` and ``&`` written as a \\u escape, so no text (``</script>``, ``<!--<script>``)
    can end the block or switch the HTML parser's script state; ``JSON.parse`` reads the same data."""
    text = json.dumps(data, separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _inline(page_path: Path, js_name: str, data: dict) -> str:
    """``page_path`` with viewer.css, dom.js and ``js_name`` inline and ``data`` in the vagent-data block."""
    text = embed_json(data)
    page = page_path.read_text()
    css = (STATIC / "viewer.css").read_text()
    dom, js = ((STATIC / name).read_text().replace("</", "<\\/") for name in ("dom.js", js_name))
    page = page.replace('<link rel="stylesheet" href="static/viewer.css">', f"<style>{css}</style>")
    page = page.replace('<script src="static/dom.js"></script>', f"<script>{dom}</script>")
    return page.replace(f'<script src="static/{js_name}"></script>',
                        f'<script id="vagent-data" type="application/json">{text}</script>\n<script>{js}</script>')


__all__ = ["make_server", "serve_in_thread", "static_html", "static_sweep_html", "embed_json", "host_name",
           "LOCAL_HOSTS", "STATIC"]
