"""``vagent view PATH``: the trajectory viewer of a run or evaluation directory, or a sweep's page
(docs/viewer.md)."""

from __future__ import annotations

import argparse
import sys


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "view", help="browse a run's or an evaluation's episodes token by token, or a sweep (docs/viewer.md)",
        description="Serve the trajectory viewer of a run directory (runs/<name>-<time>) or an evaluation "
                    "directory on 127.0.0.1, or write it as one self-contained HTML file with --out. A sweep "
                    "directory (sweep.json) shows its report's tables, curves and trials, each trial's run a "
                    "click away.",
    )
    p.add_argument("path", help="run directory, evaluation directory or sweep directory")
    p.add_argument("--out", metavar="FILE", help="write a self-contained HTML file instead of serving")
    p.add_argument("--port", type=int, default=8765, help="port on 127.0.0.1 (0: any free port; default 8765)")
    p.add_argument("--max-episodes", type=int, default=None,
                   help="with --out: at most N episodes per step / cell (default: all)")
    p.add_argument("--allow-host", metavar="NAME", action="append", default=[],
                   help="answer requests addressed to this host name too (repeatable; default: only 127.0.0.1, "
                        "localhost and [::1], so a web page cannot read the run through DNS rebinding)")
    p.add_argument("--max-token-mb", type=float, default=None, metavar="MB",
                   help="read token dumps up to this size (default 64 MB; a bigger one shows its episodes "
                        "without tokens, saying so)")
    p.add_argument("--baseline", metavar="ROW", default=None,
                   help="a sweep: the row the differences are taken against (default: the sweep's baseline)")
    p.set_defaults(func=_view)


def _view(args: argparse.Namespace) -> int:
    from pathlib import Path

    from vagent.viewer.data import MAX_TOKEN_MB, ViewerError, open_source
    from vagent.viewer.server import make_server, static_html, static_sweep_html
    from vagent.viewer.sweep import SweepSource, is_sweep_dir

    path = Path(args.path).expanduser()
    try:
        max_mb = MAX_TOKEN_MB if args.max_token_mb is None else args.max_token_mb
        source = SweepSource(path, args.baseline) if is_sweep_dir(path) else open_source(path, max_mb)
        if args.baseline and source.kind != "sweep":
            raise ViewerError(f"--baseline is for a sweep directory (with sweep.json); {path} is a "
                              f"{source.kind} directory")
        if source.kind == "sweep":
            source.index()  # a bad baseline or an unreadable trial fails here, not on the first request
    except ViewerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        page = static_sweep_html(source) if source.kind == "sweep" else static_html(source, args.max_episodes)
        out.write_text(page, encoding="utf-8")
        print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB; open it in a browser)")
        return 0
    try:
        server = make_server(source, args.port, tuple(args.allow_host))
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
