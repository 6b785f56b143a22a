"""Streaming rollout vs lockstep and overlap: RL step time and trajectories/s with long-tailed env latency.

Short ``vagent train`` runs of the default preset (configs/frozenlake_ppo.yaml; the tiny model
built untimed first, its caption pretraining, SFT and validation off, so the policy is the random
tiny model: a timing run, not a learning one) on FrozenLake whose every step takes a drawn latency
(``envs.0.latency``, Pareto by default: median ``--median-s``, tail index ``--alpha``, cut at
``--max-s``; docs/envs.md), generated on ``--replicas`` HF engine replicas (Ray actors) with
``rollout.schedule: async``. One run per mode, each in its own ``vagent train`` subprocess:

- ``lockstep``: ``rollout.overlap 0``: the update waits for the whole rollout and the next
  rollout waits for the update;
- ``overlap1``: ``rollout.overlap 1``: step k+1's rollout runs while step k updates (staleness 1);
- ``stream-K`` (K = 1, 2, 4): ``rollout.max_staleness K``: rollouts of the next K steps keep
  generating while the trainer updates, weights pushed right after each update;
- ``completion-K`` (K = 1, 2): ``stream-K`` with ``rollout.batch_order: completion``: each batch is
  the first groups to finish among the rollouts in flight (a too-stale group is dropped and played
  again; ``completion-K-keep``: trained, corrected, instead);
- ``stream-K-interrupt``: the same with ``rollout.interrupt: true``: a push stops the replies being
  generated between decode steps and they continue on the new weights (the push does not wait for
  them); ``split replies`` counts the replies a push split.

Reported per mode, from the run's ``metrics.jsonl`` with the first RL step left out (it pays the
start-up): the median ``perf/step_time_s``, trajectories/s (``rollout/episodes`` summed over
those steps / their ``perf/step_time_s`` summed), the largest ``rollout/weights_lag``, and the
ratio of each to ``overlap1`` measured in the same run (step time: overlap1 / mode, so > 1 is
faster). A mode whose config the installed vagent refuses (e.g. ``rollout.max_staleness`` before
it existed) is skipped with the reason; a run that fails is reported with its last error line.

Run:  PYTHONPATH=. python bench/streaming.py [--steps 6] [--n-train 8] [--modes lockstep,overlap1,stream-1]
          [--rounds 1] [--override rollout.max_new_tokens=48]

Timings depend on the machine: on the 2-core CI box the trainer, both replicas and Ray share the
two cores, so generation and the update slow each other down as soon as they overlap.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from common import cpu_name

ROOT = Path(__file__).resolve().parents[1]
BASELINE = "overlap1"
#: mode -> its rollout overrides (every mode also gets replicas, schedule async and the latency)
MODES = {
    "lockstep": ["rollout.overlap=0"],
    "overlap1": ["rollout.overlap=1"],
    "stream-1": ["rollout.overlap=0", "rollout.max_staleness=1"],
    "stream-2": ["rollout.overlap=0", "rollout.max_staleness=2"],
    "stream-4": ["rollout.overlap=0", "rollout.max_staleness=4"],
    "stream-1-interrupt": ["rollout.overlap=0", "rollout.max_staleness=1", "rollout.interrupt=true"],
    "stream-2-interrupt": ["rollout.overlap=0", "rollout.max_staleness=2", "rollout.interrupt=true"],
    "stream-4-interrupt": ["rollout.overlap=0", "rollout.max_staleness=4", "rollout.interrupt=true"],
    "completion-1": ["rollout.overlap=0", "rollout.max_staleness=1", "rollout.batch_order=completion"],
    "completion-1-keep": ["rollout.overlap=0", "rollout.max_staleness=1", "rollout.batch_order=completion",
                          "rollout.too_stale=keep"],
    "completion-2": ["rollout.overlap=0", "rollout.max_staleness=2", "rollout.batch_order=completion"],
    "completion-2-keep": ["rollout.overlap=0", "rollout.max_staleness=2", "rollout.batch_order=completion",
                          "rollout.too_stale=keep"],
}


@dataclass
class Result:
    """One mode's run: its metrics (steps after the first), or why there is none."""

    mode: str
    round: int
    step_s: float = float("nan")  # median perf/step_time_s
    traj_per_s: float = float("nan")  # episodes / step time, summed over the steps
    max_lag: float = float("nan")  # the largest rollout/weights_lag
    split: float = float("nan")  # rollout/split_replies summed over the steps
    wall_s: float = float("nan")  # the whole vagent train process
    load: float = float("nan")  # 1-minute load average after the run
    note: str = ""  # skipped or failed: the reason


def base_overrides(args: argparse.Namespace, tmp: Path) -> list[str]:
    latency = (f"{{dist: {args.dist}, median_s: {args.median_s}, alpha: {args.alpha}, sigma: {args.sigma}, "
               f"max_s: {args.max_s}}}")
    return [f"steps={args.steps}", "sft.steps=0", "val.every=0", f"threads={args.threads}",
            f"model.cache_dir={tmp / 'cache'}", "model.tiny_pretrain_steps=0", "model.tiny_pretrain_relation_steps=0",
            f"envs.0.n_train={args.n_train}", "envs.0.n_val=0", f"envs.0.latency={latency}",
            f"rollout.max_turns={args.max_turns}", f"rollout.max_new_tokens={args.max_new_tokens}",
            f"rollout.replicas={args.replicas}", "rollout.schedule=async",
            "update.warmup_steps=0", "ppo.critic_warmup_steps=0", "log.tensorboard=false", "log.progress=false",
            "log.rollouts_every=0", "log.checkpoint_every=0", "log.plot_every=0", "log.plots=false",
            f"out_dir={tmp / 'runs'}", *args.override]


def refused(overrides: list[str]) -> str:
    """Why the installed vagent refuses this config ('' when it loads)."""
    from vagent.config import ConfigError
    from vagent.runconfig import load_config

    try:
        load_config(None, overrides)
    except ConfigError as exc:
        return str(exc)
    return ""


def train(overrides: list[str], log: Path) -> tuple[int, float]:
    """(exit status, wall seconds) of ``vagent train --quiet`` with ``overrides``, output in ``log``."""
    t0 = time.perf_counter()
    with open(log, "w") as out:
        rc = subprocess.run([sys.executable, "-m", "vagent", "train", "--quiet", *overrides], cwd=ROOT, stdout=out,
                            stderr=subprocess.STDOUT).returncode
    return rc, time.perf_counter() - t0


def measure(run_dir: Path, res: Result) -> Result:
    """Fill ``res`` from the run's RL records after the first."""
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    recs = [r for r in recs if r.get("phase") == "rl" and "perf/step_time_s" in r][1:]
    if not recs:
        res.note = "no RL step after the first: raise --steps"
        return res
    res.step_s = statistics.median(r["perf/step_time_s"] for r in recs)
    res.traj_per_s = sum(r["rollout/episodes"] for r in recs) / sum(r["perf/step_time_s"] for r in recs)
    res.max_lag = max((r.get("rollout/weights_lag", float("nan")) for r in recs), default=float("nan"))
    res.split = sum(r.get("rollout/split_replies", 0.0) for r in recs)
    return res


def run_mode(mode: str, rnd: int, base: list[str], tmp: Path) -> Result:
    res = Result(mode, rnd)
    overrides = base + MODES[mode] + [f"name={mode}-r{rnd}"]
    why = refused(overrides)
    if why:
        res.note = f"skipped: this vagent refuses the config ({why})"
        return res
    log = tmp / f"{mode}-r{rnd}.log"
    rc, res.wall_s = train(overrides, log)
    res.load = os.getloadavg()[0]
    if rc != 0:
        lines = [x for x in log.read_text(errors="replace").splitlines() if x.strip()]
        res.note = f"failed (exit {rc}): {lines[-1] if lines else 'no output'} (log {log})"
        return res
    (run_dir,) = (tmp / "runs").glob(f"{mode}-r{rnd}-*")
    return measure(run_dir, res)


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if a == a and b == b and b > 0 else "-"  # nan != nan


def report(args: argparse.Namespace, modes: list[str], results: list[Result]) -> None:
    from vagent.envs.latency import StepLatency

    lat = StepLatency(dist=args.dist, median_s=args.median_s, alpha=args.alpha, sigma=args.sigma, max_s=args.max_s)
    print(f"\nPPO, {args.steps} RL steps (the first left out) x {args.n_train} envs, {args.max_turns} turns, "
          f"{args.max_new_tokens} new tokens/turn, {args.replicas} HF replicas, schedule async; env step latency "
          f"{args.dist} median {args.median_s:g} s, p90 {lat.quantile(0.9):.3f} s, p99 {lat.quantile(0.99):.3f} s, "
          f"cut at {args.max_s:g} s; {args.rounds} round(s), the order alternated")
    print("| mode | median step s | trajectories/s | step speed-up vs overlap1 | trajectories/s vs overlap1 | "
          "max weights lag | split replies | wall s | load after |\n|---|---|---|---|---|---|---|---|---|")
    for mode in modes:
        mine = [r for r in results if r.mode == mode]
        notes = sorted({r.note for r in mine if r.note})
        ok = [r for r in mine if not r.note]
        if not ok:
            print(f"| {mode} | - | - | - | - | - | - | - | - |  {'; '.join(notes)}")
            continue
        base = [r for r in results if r.mode == BASELINE and not r.note]
        step_s, tps = statistics.median(r.step_s for r in ok), statistics.median(r.traj_per_s for r in ok)
        b_step = statistics.median(r.step_s for r in base) if base else float("nan")
        b_tps = statistics.median(r.traj_per_s for r in base) if base else float("nan")
        print(f"| {mode} | {step_s:.2f} | {tps:.2f} | {ratio(b_step, step_s)} | {ratio(tps, b_tps)} | "
              f"{max(r.max_lag for r in ok):g} | {statistics.median(r.split for r in ok):g} | "
              f"{statistics.median(r.wall_s for r in ok):.1f} | "
              f"{statistics.median(r.load for r in ok):.2f} |" + (f"  {'; '.join(notes)}" if notes else ""))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=6, help="RL steps per run (the first is left out)")
    ap.add_argument("--n-train", type=int, default=8, help="envs per step (envs.0.n_train)")
    ap.add_argument("--max-turns", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="the trainer's torch threads")
    ap.add_argument("--dist", choices=["pareto", "lognormal"], default="pareto")
    ap.add_argument("--median-s", type=float, default=0.05, help="median env step latency, seconds")
    ap.add_argument("--alpha", type=float, default=1.5, help="pareto tail index (p99 / median = 50^(1/alpha))")
    ap.add_argument("--sigma", type=float, default=1.0, help="lognormal sigma")
    ap.add_argument("--max-s", type=float, default=2.0, help="each latency draw is cut here, seconds")
    ap.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    ap.add_argument("--rounds", type=int, default=1, help="runs per mode, the order reversed every second round")
    ap.add_argument("--override", action="append", default=[], help="a config override of every run (repeatable)")
    args = ap.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        ap.error(f"--modes: unknown {unknown}; choose from {', '.join(MODES)}")

    print(f"machine: {cpu_name()}, {os.cpu_count()} CPUs, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    tmp = Path(tempfile.mkdtemp(prefix="bench_streaming_"))
    base = base_overrides(args, tmp)
    why = refused(base)
    if why:
        sys.exit(f"the base config is refused: {why}")
    rc, wall = train([*base, "steps=0", "rollout.replicas=0", "name=build"], tmp / "build.log")  # untimed
    if rc != 0:
        sys.exit(f"building the tiny model failed (exit {rc}); see {tmp / 'build.log'}")
    print(f"tiny model built in {wall:.1f} s; runs and logs under {tmp}")
    results = []
    for rnd in range(args.rounds):
        for mode in (modes if rnd % 2 == 0 else modes[::-1]):
            res = run_mode(mode, rnd, base, tmp)
            print(f"  round {rnd} {mode}: " + (res.note or f"median step {res.step_s:.2f} s, "
                                                             f"{res.traj_per_s:.2f} trajectories/s"), flush=True)
            results.append(res)
    report(args, modes, results)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
