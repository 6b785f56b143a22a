"""Every process's CPU time in a command, Ray's daemons and killed ranks included, from the kernel's
process accounting (root only; Debian's ``acct`` package: ``apt-get install acct``).

    sudo python bench/command_cpu.py [--acct FILE] [--top 25] -- bash .ci/run
    python bench/command_cpu.py --report FILE --root PID    # a file written by an earlier run

``time`` counts only the children a command waits for: a Ray cluster's GCS, raylet, agents and
actor workers are reparented to init when their driver ends, so they fall outside it. The kernel
writes one accounting record per process as it ends (user + system CPU, start time, pid and parent
pid), whoever waits for it; this script turns accounting on, runs the command, turns it off, and
adds up the command's process tree (by parent pid) plus the processes reparented to init that
started while the command ran (on a machine where nothing else runs, the command's). It prints the
total, the CPU by process name and by part of the command (each step of the shell that runs it,
with its process tree), and the machine's CPU and load average.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from datetime import datetime
from itertools import groupby
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import cpu_name  # noqa: E402


@dataclass(frozen=True)
class Proc:
    """One accounting record: a process that ended."""
    name: str      # the command name, 15 characters at most (the kernel's ``comm``)
    cpu_s: float   # user + system
    start: float   # epoch seconds (whole seconds: the record's resolution)
    elapsed_s: float
    pid: int
    ppid: int      # at exit: 1 for a process reparented to init


def read_records(path: Path) -> list[Proc]:
    """The records of an accounting file, through ``dump-acct`` (acct's reader of its binary format)."""
    if shutil.which("dump-acct") is None:
        raise SystemExit("dump-acct not found: install Debian's acct package (apt-get install acct)")
    out = subprocess.run(["dump-acct", str(path)], capture_output=True, text=True, check=True).stdout
    ticks = os.sysconf("SC_CLK_TCK")
    procs = []
    for line in out.splitlines():
        f = [x.strip() for x in line.split("|")]
        # command|version|utime|stime|etime|uid|gid|mem|io|pid|ppid|flags|exitcode|tty|start (times in ticks)
        procs.append(Proc(f[0], (float(f[2]) + float(f[3])) / ticks,
                          datetime.strptime(f[14], "%a %b %d %H:%M:%S %Y").timestamp(), float(f[4]) / ticks,
                          int(f[9]), int(f[10])))
    return procs


def by_parent(procs: list[Proc]) -> dict[int, list[Proc]]:
    kids: dict[int, list[Proc]] = defaultdict(list)
    for p in procs:
        kids[p.ppid].append(p)
    return kids


def descendants(kids: dict[int, list[Proc]], pid: int) -> list[Proc]:
    """Every recorded process below ``pid`` (``kids``: :func:`by_parent`)."""
    out, stack = [], [pid]
    while stack:
        for c in kids.get(stack.pop(), []):
            out.append(c)
            stack.append(c.pid)
    return out


def window(procs: list[Proc]) -> tuple[float, float]:
    """From the first start to the last end of ``procs``."""
    return min(p.start for p in procs), max(p.start + p.elapsed_s for p in procs)


def command_tree(procs: list[Proc], root: int) -> tuple[list[Proc], list[Proc]]:
    """The root's process tree (by parent pid) and the processes reparented to init (with their own
    descendants) that started inside the tree's time window."""
    kids = by_parent(procs)
    tree = [p for p in procs if p.pid == root] + descendants(kids, root)
    if not tree:
        raise SystemExit(f"no accounting record of pid {root} or its children in this file")
    t0, t1 = window(tree)
    seen = {p.pid for p in tree}
    reparented: list[Proc] = []
    for p in procs:
        if p.ppid == 1 and p.pid not in seen and t0 <= p.start <= t1:
            for q in [p, *descendants(kids, p.pid)]:
                if q.pid not in seen:
                    seen.add(q.pid)
                    reparented.append(q)
    return tree, reparented


def parts(tree: list[Proc], root: int) -> list[tuple[str, list[Proc]]]:
    """The command's parts: the steps of the shell that runs it (the children of ``root``, or of the one
    process a wrapper such as ``time`` runs), each with its own process tree, in start order. A step
    whose own process works for seconds (a pytest session, whatever its name: the kernel records the
    main thread's name at exit, which gRPC renames in a Ray driver) is a test run; the others (``pip``,
    a script such as ``scripts/make-venv`` or ``scripts/vllm-env``, whose shell only waits) are installs.
    Consecutive steps of one kind merge, named by kind and order."""
    kids = by_parent(tree)
    shell = root
    while len(kids.get(shell, [])) == 1 and kids.get(kids[shell][0].pid):
        shell = kids[shell][0].pid
    def kind(step: Proc) -> str:
        return "pytest" if step.name != "pip" and step.cpu_s > 5 and step.elapsed_s > 30 else "install"

    out: list[tuple[str, list[Proc]]] = []
    seen: Counter[str] = Counter()
    for k, steps in groupby(sorted(kids.get(shell, []), key=lambda p: p.start), key=kind):
        seen[k] += 1
        out.append((f"{k} {seen[k]}", [q for step in steps for q in (step, *descendants(kids, step.pid))]))
    return out


def report(procs: list[Proc], root: int, top: int) -> None:
    tree, reparented = command_tree(procs, root)
    everything = tree + reparented
    total = sum(p.cpu_s for p in everything)
    t0, t1 = window(tree)
    print(f"{total:.0f} s of CPU ({total / 60:.1f} min) in {len(everything)} processes over "
          f"{(t1 - t0) / 60:.1f} min: {sum(p.cpu_s for p in tree):.0f} s in the command's tree, "
          f"{sum(p.cpu_s for p in reparented):.0f} s in processes reparented to init (Ray's daemons and workers, "
          f"killed jobs' orphans) that `time` does not count")
    by_name: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for p in everything:
        by_name[p.name][0] += p.cpu_s
        by_name[p.name][1] += 1
    print(f"\n{'CPU s':>8} {'procs':>6}  name")
    for name, (cpu, n) in sorted(by_name.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"{cpu:8.1f} {int(n):6d}  {name}")
    steps = parts(tree, root)
    if steps:
        print("\nby part (each step's process tree, and the processes reparented to init that started while it ran):")
        counted: set[int] = set()
        for label, procs in steps:
            t0, t1 = window(procs)
            mine = procs + [p for p in reparented if t0 <= p.start <= t1 and p.pid not in counted]
            counted |= {p.pid for p in mine}
            print(f"{sum(p.cpu_s for p in mine):8.1f} s  {label} (from {time.strftime('%H:%M:%S', time.localtime(t0))})")
        rest = sum(p.cpu_s for p in everything if p.pid not in counted)
        print(f"{rest:8.1f} s  outside the steps (the shell running them)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--acct", type=Path, default=Path("command_cpu.acct"), help="accounting file to write")
    ap.add_argument("--report", type=Path, help="report an existing accounting file instead of running")
    ap.add_argument("--root", type=int, help="with --report: the pid of the command's first process")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ARGS...")
    args = ap.parse_args()
    if args.report:
        if args.root is None:
            ap.error("--report needs --root PID (the command's pid, printed when it ran)")
        report(read_records(args.report), args.root, args.top)
        return 0
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("give the command after --, e.g. -- bash .ci/run")
    if shutil.which("accton") is None:
        raise SystemExit("accton not found: install Debian's acct package (apt-get install acct); it needs root")
    args.acct.write_bytes(b"")
    subprocess.run(["accton", str(args.acct)], check=True, stdout=subprocess.DEVNULL)
    load0, start = os.getloadavg(), time.time()
    try:
        proc = subprocess.Popen(command)
        print(f"command_cpu: running {' '.join(command)} as pid {proc.pid}; accounting in {args.acct}", flush=True)
        code = proc.wait()
    finally:
        time.sleep(3)  # the last reparented processes end (Ray's daemons after their driver)
        subprocess.run(["accton", "off"], check=False, stdout=subprocess.DEVNULL)
    print(f"\ncommand_cpu: exit status {code}, {(time.time() - start) / 60:.1f} min; {cpu_name()}; "
          f"load average at start {load0[0]:.2f}, at end {os.getloadavg()[0]:.2f}")
    report(read_records(args.acct), proc.pid, args.top)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
