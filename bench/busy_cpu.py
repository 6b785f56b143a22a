"""How a vagent workload degrades when other processes hold the cores, by OpenMP wait policy.

The workload (a subprocess, 2 torch threads as the default run): ``--steps`` forward + backward
passes of the default run's tiny Qwen3-VL (3 layers, hidden 128) on a batch of 4 rows x 384 tokens
with a 128 px image each, the shape of a PPO micro-batch. It runs alone and beside ``k`` busy
processes (``while True: pass``, started by this script), for each wait policy of the OpenMP
runtime torch uses (libgomp):

- ``default``: libgomp's own (idle worker threads spin for a while before sleeping);
- ``passive``: ``OMP_WAIT_POLICY=PASSIVE`` (idle workers sleep at once);
- ``vagent``: what the vagent command sets when the user set nothing (vagent/omp.py: PASSIVE when
  ``machine_load()``, the other processes runnable as it starts, is at least half the cores, else
  ``GOMP_SPINCOUNT=100000``; the busy processes started right before the workload are runnable,
  so this row shows the busy machine's choice beside them, and the idle one's alone);
- ``spin<N>`` (e.g. ``spin10000``): libgomp spins at most N times before sleeping (``GOMP_SPINCOUNT``).

Printed per policy and load: wall seconds, the slowdown against the same policy alone, and that
slowdown over the fair share (k busy processes and our 2 threads on C cores get
``min(1, C / (k + 2))`` of the machine each, so the fair slowdown is ``max(1, (k + 2) / C)``): 1.0
is a fair share, the goal is <= 1.3. Also the idle cost of each policy against ``default``.

``--workload train`` times a whole run instead: the default pipeline scaled down (the golden
test's run, ``vagent.runconfig.presets.SCALED_DEFAULT_OVERRIDES``: caption pretraining 12 + 8
steps, 4 SFT steps, 2 PPO steps, 3 validations; a fresh model cache each time, so pretraining is
timed too), ``vagent train`` in a subprocess as a user starts it. ``--workload default`` times README command 1's run itself: the
embedded default (``vagent train`` with no overrides: caption pretraining, SFT 300 x 8, PPO 20 x 16,
three validations; 13.6 minutes alone on a 2-core AMD EPYC, so use ``--repeats 1``). Both
run workloads also check that the run's ``metrics.jsonl`` (timing fields aside) is the same beside
busy processes as alone: load may change how long a run takes, never what it computes.

Run:  PYTHONPATH=. .venv/bin/python bench/busy_cpu.py [--busy 0,2,4] [--steps 6] [--repeats 3]
      PYTHONPATH=. .venv/bin/python bench/busy_cpu.py --workload train --policies vagent --repeats 1
      PYTHONPATH=. .venv/bin/python bench/busy_cpu.py --workload default --policies vagent --repeats 1
Measure on an otherwise idle machine (the busy processes are the only load).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from vagent.runconfig.presets import SCALED_DEFAULT_OVERRIDES

WORKLOAD = r"""
import sys, time
import os
from vagent.omp import apply_wait_settings
apply_wait_settings(os.environ)  # first, as the vagent command does (policy "vagent"; the others keep theirs)
import torch
from vagent.models.tiny import build_tiny_vlm
from vagent.models.loading import load_policy
from vagent.models.forward import forward_logits
import tempfile, numpy as np
from PIL import Image
torch.set_num_threads(2)
path = build_tiny_vlm(tempfile.mkdtemp() + "/m", family="qwen3_vl", hidden=128, layers=3, image_size=128)
loaded = load_policy(path)
enc, model = loaded.encoder, loaded.model
img = Image.fromarray(np.random.default_rng(0).integers(0, 255, (128, 128, 3), dtype=np.uint8))
seg = enc.encode_user("Where is the goal? <image>" + " left" * 300, [img])
ids = torch.tensor([list(seg.input_ids)] * 4)
pv = torch.cat([seg.pixel_values] * 4)
grid = torch.cat([seg.image_grid_thw] * 4)
mask = torch.ones_like(ids)
steps = int(sys.argv[1])
for i in range(steps + 1):
    if i == 1:
        t = time.perf_counter()  # the first step warms up
    logits = forward_logits(model, ids, mask, pv, grid)
    logits.float().logsumexp(-1).mean().backward()
print("WORKLOAD_S", time.perf_counter() - t)
"""

POLICIES = {"default": {}, "passive": {"OMP_WAIT_POLICY": "PASSIVE"}, "vagent": None}


#: the golden test's scaled-down default pipeline
SCALED = list(SCALED_DEFAULT_OVERRIDES)


#: what each run workload computed, by (policy, busy processes): its metrics without timing fields
RECORDS: dict[tuple[str, int], list[dict]] = {}


def _computed(metrics: str) -> list[dict]:
    from vagent.runs.metrics import without_timing

    return [without_timing(json.loads(line)) for line in metrics.splitlines()]


def train_workload(env: dict[str, str], overrides: list[str], key: tuple[str, int]) -> float:
    """Wall seconds of one run (``vagent train`` with ``overrides``) in a fresh folder and model cache;
    its metrics without timing fields go to ``RECORDS[key]``."""
    import glob
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "vagent", "train", *overrides, f"out_dir={tmp}/runs",
                               f"model.cache_dir={tmp}/cache"], env=env, cwd=tmp, capture_output=True, text=True)
        wall = time.perf_counter() - t
        if done.returncode != 0:
            raise SystemExit(f"vagent train failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
        (metrics,) = glob.glob(f"{tmp}/runs/*/metrics.jsonl")
        with open(metrics) as f:
            RECORDS[key] = _computed(f.read())
        return wall


def run(policy: str, busy: int, steps: int, workload: str = "step") -> float:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "VAGENT_OMP_WAIT")}
    env["PYTHONPATH"] = os.getcwd()
    if policy == "default":
        env["VAGENT_OMP_WAIT"] = "keep"  # vagent leaves libgomp's default alone
    elif policy == "passive":
        env.update(POLICIES["passive"], VAGENT_OMP_WAIT="keep")
    elif policy.startswith("spin"):  # spin<N>: active waiting for at most N spins (libgomp's GOMP_SPINCOUNT)
        env.update(GOMP_SPINCOUNT=policy[4:], VAGENT_OMP_WAIT="keep")
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
    try:
        if workload in ("train", "default"):
            return train_workload(env, SCALED if workload == "train" else [], (policy, busy))
        out = subprocess.run([sys.executable, "-c", WORKLOAD, str(steps)], env=env, capture_output=True, text=True,
                             check=True).stdout
    finally:
        for b in burners:
            b.kill()
            b.wait()
    return float(next(ln for ln in out.splitlines() if ln.startswith("WORKLOAD_S")).split()[1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--busy", default="0,2,4")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--policies", default="default,passive,spin100000,vagent")
    ap.add_argument("--workload", choices=("step", "train", "default"), default="step",
                    help="step: forward + backward passes of a PPO micro-batch; train: a scaled default run; "
                         "default: the embedded default run (README command 1)")
    args = ap.parse_args()
    cores = os.cpu_count() or 1
    loads = [int(x) for x in args.busy.split(",")]
    policies = args.policies.split(",")
    times: dict[tuple[str, int], list[float]] = {}
    load_before = os.getloadavg()[0]
    for _ in range(args.repeats):  # rounds alternate the policies, so drift hits them alike
        for k in loads:
            for p in policies:
                times.setdefault((p, k), [])
                times[(p, k)].append(run(p, k, args.steps, args.workload))
    med = {key: statistics.median(v) for key, v in times.items()}
    what = {"train": "a scaled default run", "default": "the default run"}.get(args.workload, f"{args.steps} steps")
    print(f"\n{cores} cores; workload {what}; median of {args.repeats}; load average before start: "
          f"{load_before:.2f}")
    print("| policy | busy processes | wall s | slowdown | fair slowdown | over fair share | idle cost vs default |")
    print("|---|---|---|---|---|---|---|")
    for p in policies:
        for k in loads:
            slow = med[(p, k)] / med[(p, 0)]
            fair = max(1.0, (k + 2) / cores)
            idle = f"{med[(p, 0)] / med[('default', 0)]:.2f}x" if ("default", 0) in med else "- (default not run)"
            print(f"| {p} | {k} | {med[(p, k)]:.2f} | {slow:.2f}x | {fair:.2f}x | {slow / fair:.2f} | {idle} |")
    if RECORDS:  # the same computation at every load: each run's metrics against its policy's run alone
        for (p, k), recs in sorted(RECORDS.items()):
            alone = RECORDS.get((p, 0))
            if alone is not None and k:
                same = "equal" if recs == alone else "DIFFERENT"
                print(f"{p}, {k} busy: {len(recs)} metrics records, {same} to the run alone (timing fields aside)")
        if any(recs != RECORDS.get((p, 0), recs) for (p, _), recs in RECORDS.items()):
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
