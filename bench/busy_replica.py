"""How long a Ray worker (an engine replica's process) takes for a fixed piece of CPU work beside
busy processes, at the niceness vagent starts Ray workers with (0, the driver's) and at Ray's
default (+15).

    PYTHONPATH=. python bench/busy_replica.py [--busy 2] [--work 3e7] [--repeats 3]

For each niceness, in a fresh process: ``vagent.models.ray_cluster.start_ray`` (with
``RAY_worker_niceness`` set), then one task on a Ray worker that runs ``--work`` loop iterations of
pure Python (one core's worth of a replica's decode loop), timed alone and beside ``--busy``
processes (``while True: pass``, at niceness 0, started by this script). Prints the median wall
seconds and the slowdown against alone. A fair share of C cores between k busy processes and the
worker is ``(k + 1) / C`` of the alone time when k + 1 > C.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

PROBE = r"""
import json, os, sys, time
os.environ["RAY_worker_niceness"] = sys.argv[1]
from vagent.models.ray_cluster import start_ray
ray = start_ray(1)

@ray.remote
def work(n):
    t0 = time.perf_counter()
    x = 0
    for i in range(int(n)):
        x += i * i % 7
    return time.perf_counter() - t0, os.nice(0)

ray.get(work.remote(1e5))  # the worker is up
print("READY", flush=True)
sys.stdin.readline()  # the busy processes start (or not) now
times, nice = [], None
for _ in range(int(sys.argv[3])):
    t, nice = ray.get(work.remote(float(sys.argv[2])))
    times.append(t)
print("RESULT " + json.dumps({"times": times, "nice": nice}), flush=True)
ray.shutdown()
"""


def one(niceness: int, busy: int, work: float, repeats: int) -> dict:
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.Popen([sys.executable, "-c", PROBE, str(niceness), str(work), str(repeats)], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdin is not None
    while "READY" not in (line := proc.stdout.readline()):
        if not line and proc.poll() is not None:
            raise SystemExit(f"the probe failed to start Ray (exit {proc.returncode})")
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
    time.sleep(0.5 if busy else 0)
    try:
        proc.stdin.write("go\n")
        proc.stdin.flush()
        out = proc.stdout.read()
    finally:
        for p in loops:
            p.kill()
            p.wait()
    proc.wait()
    result = json.loads(next(ln for ln in out.splitlines() if ln.startswith("RESULT "))[len("RESULT "):])
    return {"median_s": statistics.median(result["times"]), "nice": result["nice"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--busy", type=int, default=2)
    ap.add_argument("--work", type=float, default=3e7)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at the start, {args.busy} busy processes")
    print("| worker niceness | alone s | beside busy s | slowdown |")
    print("| --- | --- | --- | --- |")
    for niceness in (0, 15):
        alone = one(niceness, 0, args.work, args.repeats)
        busy = one(niceness, args.busy, args.work, args.repeats)
        print(f"| {busy['nice']} | {alone['median_s']:.2f} | {busy['median_s']:.2f} | "
              f"{busy['median_s'] / alone['median_s']:.1f}x |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
