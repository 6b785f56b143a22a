"""Where the test suite's CPU time goes: each test's CPU seconds, by test and by file.

    python bench/suite_cpu.py [--out suite_cpu.jsonl] [--top 40] [-- PYTEST ARGS...]
    python bench/suite_cpu.py --report suite_cpu.jsonl   # the table of a run so far (or one that was stopped)

runs pytest in this process with a small plugin that reads, around each test (set-up, call and
tear-down together):

- ``self``: this process's user+system CPU (``getrusage(RUSAGE_SELF)``);
- ``children``: the CPU of child processes that ended and were waited for during the test
  (``RUSAGE_CHILDREN``: ``vagent train`` subprocesses, torchrun and its ranks, servers);
- ``machine``: the whole machine's busy CPU from ``/proc/stat`` (catches daemons nobody waits for,
  such as Ray's raylet and workers; on a machine running other work it counts theirs too).

It prints the tests and files that cost the most, the suite's totals and the machine's CPU and
load average; every test's figures go to ``--out`` (one JSON line per test, written as it ends, so
a stopped run keeps what it measured). Wall time is in pytest's own
``--durations``; CPU is what a 2-core CI machine runs out of.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import cpu_name  # noqa: E402


def _rusage_s(who: int) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def _machine_busy_s() -> float:
    """Busy CPU seconds of every core since boot (``/proc/stat``: all but idle and iowait)."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except OSError:
        return 0.0
    ticks = [int(x) for x in fields]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
    return (sum(ticks[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _clocks() -> tuple[float, float, float]:
    """(this process's and its waited-for children's CPU, the machine's busy CPU, wall), seconds."""
    return (_rusage_s(resource.RUSAGE_SELF) + _rusage_s(resource.RUSAGE_CHILDREN), _machine_busy_s(),
            time.perf_counter())


class CpuPerTest:
    """The pytest plugin: one record per test id."""

    def __init__(self, out: Path) -> None:
        self.records: dict[str, dict[str, float]] = {}
        self.out = out
        out.write_text("")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None):  # type: ignore[no-untyped-def]
        def now() -> tuple[float, float, float, float]:
            return (_rusage_s(resource.RUSAGE_SELF), _rusage_s(resource.RUSAGE_CHILDREN), _machine_busy_s(),
                    time.perf_counter())

        start = now()
        yield
        end = now()
        self.records[item.nodeid] = {k: round(b - a, 3) for k, a, b in
                                     zip(("self", "children", "machine", "wall"), start, end)}
        with self.out.open("a") as f:
            f.write(json.dumps({"test": item.nodeid, **self.records[item.nodeid]}) + "\n")


def report(records: dict[str, dict[str, float]], top: int) -> str:
    def cpu(r: dict[str, float]) -> float:
        return r["self"] + r["children"]

    lines = [f"{'cpu s':>8} {'machine s':>9} {'wall s':>7}  test"]
    for name, r in sorted(records.items(), key=lambda kv: -max(cpu(kv[1]), kv[1]["machine"]))[:top]:
        lines.append(f"{cpu(r):8.1f} {r['machine']:9.1f} {r['wall']:7.1f}  {name}")
    by_file: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0])
    for name, r in records.items():
        f = by_file[name.split("::")[0]]
        f[0] += cpu(r); f[1] += r["machine"]; f[2] += r["wall"]; f[3] += 1
    lines += ["", f"{'cpu s':>8} {'machine s':>9} {'wall s':>7} {'tests':>5}  file"]
    for name, (c, m, w, n) in sorted(by_file.items(), key=lambda kv: -max(kv[1][0], kv[1][1]))[:top]:
        lines.append(f"{c:8.1f} {m:9.1f} {w:7.1f} {int(n):5d}  {name}")
    total = [sum(cpu(r) for r in records.values()), sum(r["machine"] for r in records.values()),
             sum(r["wall"] for r in records.values())]
    lines += ["", f"{len(records)} tests: {total[0]:.0f} s of CPU (this process and its waited-for children), "
              f"{total[1]:.0f} s of the machine's busy CPU, {total[2]:.0f} s wall",
              f"{cpu_name()}, {os.cpu_count()} cores, load average at the end {os.getloadavg()}"]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("suite_cpu.jsonl"))
    parser.add_argument("--report", type=Path, help="print the table of an earlier run's --out file and exit")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("pytest_args", nargs="*", help="after --: pytest's own arguments (default: -q)")
    args = parser.parse_args()
    if args.report:
        lines = [json.loads(x) for x in args.report.read_text().splitlines() if x.strip()]
        print(report({r.pop("test"): r for r in lines}, args.top))
        return 0
    plugin = CpuPerTest(args.out)
    start = _clocks()
    code = pytest.main(args.pytest_args or ["-q"], plugins=[plugin])
    print(report(plugin.records, args.top))
    cpu, machine, wall = (b - a for a, b in zip(start, _clocks()))
    print(f"the whole pytest run (collection and imports included): {cpu / 60:.1f} min of CPU, "
          f"{machine / 60:.1f} min of the machine's busy CPU, {wall / 60:.1f} min wall")
    print(f"every test's figures: {args.out}")
    return int(code)


if __name__ == "__main__":
    sys.exit(main())
