"""CPU of vagent's start on two or more Python interpreters (venvs holding the same packages): the
first is the baseline, measured in the same run, interleaved. scripts/make-venv picks the
distribution's interpreter over a build without optimizations on these figures.

    python bench/interpreters.py --python /path/a/.venv/bin/python --python /path/b/.venv/bin/python [--repeats 7]

Two commands on each: ``python -c "import vagent.recipes.run"`` (what every training process, rank
and replica imports first) and a 2-step PPO run of the tiny VLM in one process (the tests' settings,
bench/startup_cpu.py's ``TINY``). Each command's CPU is its own plus its waited-for children's.
Prints the medians, their ratio to the baseline's, the CPU and the load average.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import cpu_name  # noqa: E402
from startup_cpu import TINY, cpu_of  # noqa: E402


def describe(python: str) -> str:
    """``python``'s version and base interpreter, or SystemExit naming what is wrong with it."""
    probe = "import sys, vagent; print(sys.version.split()[0], sys._base_executable)"
    try:
        out = subprocess.run([python, "-c", probe], capture_output=True, text=True)
    except OSError as exc:
        raise SystemExit(f"--python {python}: {exc.strerror}; name an interpreter (a venv's bin/python)") from None
    if out.returncode != 0:
        raise SystemExit(f"--python {python}: it does not run vagent ({out.stderr.strip()[-300:] or out.returncode}); "
                         "name a venv's python that has vagent installed (pip install -e .)")
    version, base = out.stdout.split()
    return f"Python {version} ({os.path.realpath(base)})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", action="append", required=True, help="an interpreter (give two or more; the first "
                    "is the baseline)")
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    if len(args.python) < 2 or args.repeats < 1:
        ap.error("give --python at least twice and --repeats of at least 1")
    names = {p: describe(p) for p in args.python}
    from vagent.models.tiny import build_tiny_vlm

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model = build_tiny_vlm(root / "tiny-vlm", hidden=64, layers=2, image_size=64)
        commands = {"import vagent.recipes.run": ["-c", "import vagent.recipes.run"],
                    "2-step PPO run": ["-m", "vagent", "train", *TINY, f"model.path={model}"]}
        print(f"{cpu_name()}, {os.cpu_count()} cores; load average at start {os.getloadavg()[0]:.2f}")
        for label, cmd in commands.items():
            cpu: dict[str, list[float]] = {p: [] for p in args.python}
            for i in range(args.repeats):
                for k, python in enumerate(args.python):
                    out = [f"out_dir={root / 'runs' / str(k) / str(i)}"] if cmd[0] == "-m" else []
                    cpu[python].append(cpu_of([python, *cmd, *out], dict(os.environ)))
            base = statistics.median(cpu[args.python[0]])
            print(f"{label} (medians of {args.repeats}):")
            for python, values in cpu.items():
                m = statistics.median(values)
                print(f"  {m:6.2f} s of CPU ({min(values):.2f}-{max(values):.2f}), {m / base:.2f}x the first: "
                      f"{names[python]}")
        print(f"load average at end {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
