"""Serve the viewer on loopback, or write it as one self-contained HTML file.

The page is ``static/index.html`` + ``viewer.js`` + ``viewer.css`` (plain HTML/JS written for
vagent, no third-party code, nothing fetched from elsewhere). Served, it asks this small JSON API
(all GET, loopback only)::

    /api/index                       groups, RL steps, validation points (data.py: index())
    /api/episodes?group=G            the group's episode summaries (filtering/sorting/paging in the page)
    /api/episode?group=G&i=N         one episode: turns, reward parts, token rows
    /files/<path>                    a frame (PNG) inside the directory

Written (``--out FILE``), the same page carries all three documents and every frame (as data:
URIs) in a ``<script type="application/json">`` block, and the page reads them from there.
"""

from __future__ import annotations

import base64
import json
import mimetypes
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

from vagent.viewer.data import ViewerError

STATIC = Path(__file__).parent / "static"
_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
          ".css": "text/css; charset=utf-8"}


def _json_bytes(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), allow_nan=False).encode()


class _Handler(BaseHTTPRequestHandler):
    source: Any = None  # set on the subclass made by make_server

    def log_message(self, fmt: str, *args: Any) -> None:  # quiet: the command prints the URL once
        pass

    def _send(self, code: int, body: bytes, ctype: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        url = urlparse(self.path)
        q = {k: v[0] for k, v in parse_qs(url.query).items()}
        try:
            if url.path in ("/", "/index.html"):
                return self._send(200, (STATIC / "index.html").read_bytes(), _TYPES[".html"])
            if url.path.startswith("/static/"):
                name = url.path.removeprefix("/static/")
                path = STATIC / name
                if "/" in name or not path.is_file():
                    raise ViewerError(f"no static file {name!r}")
                return self._send(200, path.read_bytes(), _TYPES.get(path.suffix, "application/octet-stream"))
            if url.path == "/api/index":
                return self._send(200, _json_bytes(self.source.index()), "application/json")
            if url.path == "/api/episodes":
                return self._send(200, _json_bytes(self.source.episodes(q.get("group", ""))), "application/json")
            if url.path == "/api/episode":
                doc = self.source.episode(q.get("group", ""), int(q.get("i", "-1")))
                return self._send(200, _json_bytes(doc), "application/json")
            if url.path.startswith("/files/"):
                path = self.source.file(unquote(url.path.removeprefix("/files/")))
                ctype = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
                return self._send(200, path.read_bytes(), ctype)
            raise ViewerError(f"no such page {url.path!r}")
        except (ViewerError, ValueError) as exc:
            self._send(404, _json_bytes({"error": str(exc)}), "application/json")


def make_server(source: Any, port: int = 8765) -> ThreadingHTTPServer:
    """An HTTP server for ``source`` on 127.0.0.1:``port`` (0: any free port); not yet serving."""
    handler = type("Handler", (_Handler,), {"source": source})
    server = ThreadingHTTPServer(("127.0.0.1", port), handler)
    server.daemon_threads = True
    return server


def serve_in_thread(source: Any, port: int = 0) -> tuple[ThreadingHTTPServer, str]:
    """Start serving in a daemon thread; returns (server, base URL). ``server.shutdown()`` stops it."""
    server = make_server(source, port)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


def _data_uri(path: Path) -> str:
    ctype = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
    return f"data:{ctype};base64,{base64.b64encode(path.read_bytes()).decode()}"


def static_html(source: Any, max_episodes: int | None = None) -> str:
    """The self-contained page: HTML, CSS, JS, the documents and frames inline (see the module docstring).

    max_episodes: at most this many episodes per group (the first ones); None = all.
    """
    index = source.index()
    episodes, details, files = {}, {}, {}
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
    data = json.dumps({"index": index, "episodes": episodes, "details": details, "files": files},
                      separators=(",", ":"), allow_nan=False).replace("</", "<\\/")
    page = (STATIC / "index.html").read_text()
    css, js = (STATIC / "viewer.css").read_text(), (STATIC / "viewer.js").read_text().replace("</", "<\\/")
    page = page.replace('<link rel="stylesheet" href="static/viewer.css">', f"<style>{css}</style>")
    page = page.replace('<script src="static/viewer.js"></script>',
                        f'<script id="vagent-data" type="application/json">{data}</script>\n<script>{js}</script>')
    return page


__all__ = ["make_server", "serve_in_thread", "static_html", "STATIC"]
