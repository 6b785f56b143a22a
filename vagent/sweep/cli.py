"""``vagent sweep``: run a sweep file's trials on Ray Tune, and report them.

    vagent sweep SWEEP.yaml [--out DIR] [--num-cpus N] [--num-gpus N]   # run or continue
    vagent sweep report DIR [--baseline ROW] [--out REPORT_DIR]         # tables and plots

Running it again continues the sweep: finished trials are skipped, interrupted ones resume from
their checkpoints (docs/sweep.md).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "sweep", help="run a grid of run configs x seeds on Ray Tune (resumable); 'sweep report DIR' tabulates it",
        description="vagent sweep SWEEP.yaml runs (or continues) every trial of the sweep file; "
                    "vagent sweep report DIR writes report.md, report.json and curve PNGs (docs/sweep.md).",
    )
    p.add_argument("target", nargs="+", metavar="SWEEP.yaml | report DIR",
                   help="a sweep file to run, or 'report' and a sweep directory")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="run: the sweep directory (default <out_dir>/<name> of the sweep file); "
                        "report: where the report goes (default DIR/report)")
    p.add_argument("--num-cpus", type=int, default=None, metavar="N",
                   help="run: CPUs of the local Ray cluster (default all)")
    p.add_argument("--num-gpus", type=int, default=None, metavar="N",
                   help="run: GPUs of the local Ray cluster (default all)")
    p.add_argument("--baseline", default=None, metavar="ROW",
                   help="report: the reference row (default the sweep file's)")
    p.add_argument("--quiet", action="store_true", help="run: print only errors")
    p.set_defaults(func=run_sweep_command)


def _error(msg: str) -> int:
    print(f"error: {msg}", file=sys.stderr)
    return 1


def run_sweep_command(args: argparse.Namespace) -> int:
    from vagent.config import ConfigError

    if args.target[0] == "report" and not Path("report").is_file():
        if len(args.target) != 2:
            return _error(f"vagent sweep report takes one sweep directory, got {args.target[1:]}: "
                          "vagent sweep report sweeps/NAME")
        return _report(Path(args.target[1]), args)
    if len(args.target) != 1:
        return _error(f"vagent sweep takes one sweep file, got {args.target}: vagent sweep configs/sweeps/FILE.yaml "
                      "(or vagent sweep report DIR)")
    try:
        from vagent.sweep.runner import run_sweep
        from vagent.sweep.spec import load_sweep

        sweep = load_sweep(args.target[0])
        sweep_dir = Path(args.out) if args.out else Path(sweep.config.out_dir) / sweep.config.name
        say = (lambda _msg: None) if args.quiet else print
        outcome = run_sweep(sweep, sweep_dir, num_cpus=args.num_cpus, num_gpus=args.num_gpus, say=say)
    except (ConfigError, ImportError, RuntimeError) as exc:
        return _error(str(exc))
    for trial, err in sorted(outcome.errors.items()):  # one line each; a run's train.log is in its folder
        print(f"error: trial {trial} failed: {err}; its folder: {outcome.sweep_dir / 'trials' / trial}",
              file=sys.stderr)
    say(f"{outcome.finished}/{outcome.total} trials finished; report: vagent sweep report {outcome.sweep_dir}")
    return 0 if outcome.finished == outcome.total and not outcome.errors else 1


def _report(sweep_dir: Path, args: argparse.Namespace) -> int:
    from vagent.sweep.report import ReportError, write_report

    try:
        out = write_report(sweep_dir, Path(args.out) if args.out else None, baseline=args.baseline)
    except ReportError as exc:
        return _error(str(exc))
    print(f"report: {out / 'report.md'} (numbers in report.json, curves in {out}/*.png)")
    return 0
