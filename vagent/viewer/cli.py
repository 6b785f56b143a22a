"""``vagent view PATH``: the trajectory viewer of a run or evaluation directory (docs/viewer.md)."""

from __future__ import annotations

import argparse
import sys


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "view", help="browse a run's or an evaluation's episodes token by token (docs/viewer.md)",
        description="Serve the trajectory viewer of a run directory (runs/<name>-<time>) or an evaluation "
                    "directory on 127.0.0.1, or write it as one self-contained HTML file with --out.",
    )
    p.add_argument("path", help="run directory or evaluation directory")
    p.add_argument("--out", metavar="FILE", help="write a self-contained HTML file instead of serving")
    p.add_argument("--port", type=int, default=8765, help="port on 127.0.0.1 (0: any free port; default 8765)")
    p.add_argument("--max-episodes", type=int, default=None,
                   help="with --out: at most N episodes per step / cell (default: all)")
    p.set_defaults(func=_view)


def _view(args: argparse.Namespace) -> int:
    from pathlib import Path

    from vagent.viewer.data import ViewerError, open_source
    from vagent.viewer.server import make_server, static_html

    try:
        source = open_source(args.path)
    except ViewerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(static_html(source, args.max_episodes), encoding="utf-8")
        print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB; open it in a browser)")
        return 0
    try:
        server = make_server(source, args.port)
    except OSError as exc:
        print(f"error: cannot listen on 127.0.0.1:{args.port} ({exc}); pass --port 0 for any free port",
              file=sys.stderr)
        return 2
    print(f"vagent view: serving {source.root} ({source.kind}) at http://127.0.0.1:{server.server_address[1]}/ "
          "(Ctrl-C to stop)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0
