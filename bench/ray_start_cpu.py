"""The CPU a local Ray cluster costs vagent: start it (``start_ray``), run one actor call, idle a
few seconds, and sum the CPU of every process of the session (``ray_session_processes``) and of
the driver, with and without Ray's prestarted idle workers.

    PYTHONPATH=. python bench/ray_start_cpu.py [--rounds 3] [--idle-s 8]

Each try runs in a fresh process (one cluster per process); the two settings alternate within a
round. ``start_ray`` turns prestarting off unless the caller set it; the baseline sets it on
(``RAY_prestart_worker_first_driver=1``, ``RAY_enable_worker_prestart=1``). Prints each try and
the medians, and the ratio against the baseline measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import cpu_name  # noqa: E402

TRY = """
import json, os, sys, time
import psutil
from vagent.models.ray_cluster import ray_session_processes, start_ray
t0 = time.time()
ray = start_ray(num_cpus=2)
@ray.remote
class Probe:
    def pid(self):
        return os.getpid()
ray.get(Probe.remote().pid.remote())
time.sleep(float(sys.argv[1]))
ray_cpu, names = 0.0, []
for p in ray_session_processes(os.getpid()):
    try:
        t = p.cpu_times()
        ray_cpu += t.user + t.system
        names.append(p.name())
    except psutil.Error:
        pass
me = psutil.Process().cpu_times()
print(json.dumps({"ray_cpu": ray_cpu, "driver_cpu": me.user + me.system, "processes": sorted(names),
                  "wall": time.time() - t0}))
ray.shutdown()
"""

SETTINGS = {"prestart (Ray's default)": "1", "no prestart (start_ray's)": "0"}


def one_try(flag: str, idle_s: float) -> dict:
    env = dict(os.environ, RAY_prestart_worker_first_driver=flag, RAY_enable_worker_prestart=flag)
    env.pop("RAY_ADDRESS", None)
    out = subprocess.run([sys.executable, "-c", TRY, str(idle_s)], env=env, capture_output=True, text=True,
                         timeout=300, cwd=Path(__file__).resolve().parent.parent)
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode != 0 or not line:
        raise SystemExit(f"a try failed ({out.returncode}):\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}")
    return json.loads(line[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--idle-s", type=float, default=8.0)
    args = ap.parse_args()
    print(f"CPU: {cpu_name()}; load average at start {os.getloadavg()[0]:.2f}")
    runs: dict[str, list[float]] = {k: [] for k in SETTINGS}
    for r in range(args.rounds):
        order = list(SETTINGS.items()) if r % 2 == 0 else list(SETTINGS.items())[::-1]
        for name, flag in order:
            res = one_try(flag, args.idle_s)
            total = res["ray_cpu"] + res["driver_cpu"]
            runs[name].append(total)
            print(f"round {r}: {name}: {total:.2f} s of CPU (Ray's {res['ray_cpu']:.2f}, the driver's "
                  f"{res['driver_cpu']:.2f}), {len(res['processes'])} processes: {res['processes']}")
    base = statistics.median(runs["prestart (Ray's default)"])
    for name, vals in runs.items():
        med = statistics.median(vals)
        print(f"{name}: median {med:.2f} s of CPU a cluster ({med / base:.2f}x of the baseline, "
              f"{base - med:+.2f} s)")
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
