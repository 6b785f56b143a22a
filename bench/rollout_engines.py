"""Benchmark the rollout engines and schedules on CPU (tiny random VLM, FrozenLake with images).

Three measurements, each side by side in one process on the same seeds:

1. ``replicas``: episodes/s of a lockstep rollout (greedy, ``--episodes`` envs, ``--turns``
   turns) generated in process (``HFEngine``), on 1 and on 2 ``RemoteEngine`` replicas (Ray
   actors, ``--replica-threads`` torch threads each). Checks that all three played the same ids.
2. ``schedule``: lockstep vs asynchronous rollout (in-process ``BatchingEngine``) with envs of
   unequal latency: every second env's ``step`` sleeps ``--delay`` seconds (an env service with
   added latency next to a fast local env). Checks the two played the same episodes.
3. ``overlap``: wall time per RL step of a small PPO run (``vagent train`` config, 1 replica)
   with ``rollout.overlap`` 0 and 1, from the metrics' timestamps of steps 1..N (step 0 has no
   overlap to gain). Also prints each run's final ``reward/mean`` (few steps: not a learning
   comparison).
4. ``vllm`` (needs vLLM: ``.venv-vllm/bin/python``, built by ``scripts/vllm-env``): the same
   greedy rollout on ``HFEngine`` and on ``VLLMEngine`` (in process, fp32): episodes/s, sampled
   tokens/s, and vLLM's start-up time (``LLM`` construction: engine process, model load, KV-cache
   planning); checks that both played the same ids.
5. ``train``: the default run (``vagent train`` with no config: configs/frozenlake_ppo.yaml),
   ``--train-steps`` RL steps with SFT and validation off, with ``rollout.engine`` hf and vllm:
   median RL step time, median rollout generation time, the run's wall time (vLLM's start-up
   included), and each step split into generation, the rest of the rollout, the weight push and
   canary before it, and scoring + update (with the batch's tokens: sampled replies differ by
   engine), in ``vagent train`` subprocesses after an untimed run that builds the tiny model;
   ``--rounds`` runs per engine, their order alternated by round, with each run's OpenMP wait
   settings (its environment.json: they change the step time far more than the engine does on a
   small CPU) and the speed-up of each round and of the medians.

Run:  PYTHONPATH=. python bench/rollout_engines.py [--episodes 16] [--turns 3] [--part all]
      PYTHONPATH=. .venv-vllm/bin/python bench/rollout_engines.py --part vllm   (and --part train [--rounds 3]
          [--train-override model.tiny_pretrain_steps=0 --train-override model.tiny_pretrain_relation_steps=0])

The printed table is in docs/results.md form. Timings depend on the machine (the 2-core CI
machine shares its cores between the trainer, the replicas and the Ray processes).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path


class SlowEnv:
    """An env whose ``step`` takes ``delay`` extra seconds."""

    def __init__(self, env, delay: float):
        self.env, self.delay = env, delay

    def step(self, text):
        time.sleep(self.delay)
        return self.env.step(text)

    def __getattr__(self, name):
        return getattr(self.env, name)


def ids(eps):
    return [[t.sampled_token_ids for t in e.turns] for e in eps]


def timed_rollout(policy, specs, sampling, turns, repeats):
    """(median seconds over ``repeats`` rollouts of ``specs`` after a warm-up, the last episodes)."""
    from vagent.rollout import rollout

    rollout(specs[:2], policy, sampling, max_turns=1)  # warm-up
    t = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        eps = rollout(specs, policy, sampling, max_turns=turns)
        t.append(time.perf_counter() - t0)
    return statistics.median(t), eps


def bench_replicas(args, loaded, specs, sampling, rows):
    from vagent.models.engine import HFEngine
    from vagent.models.remote import RemoteEngine, start_ray
    from vagent.rollout import HFPolicy

    def timed(policy):
        return timed_rollout(policy, specs, sampling, args.turns, args.repeats)

    s0, ref = timed(HFPolicy(HFEngine(loaded.model, loaded.encoder)))
    rows.append(("in-process HFEngine", len(ref) / s0, s0, "reference"))
    ray = start_ray(num_cpus=2)
    try:
        for n in (1, 2):
            engine = RemoteEngine(loaded.model, loaded.encoder, replicas=n, threads=args.replica_threads)
            s, eps = timed(HFPolicy(engine))
            rows.append((f"RemoteEngine, {n} replica(s)", len(eps) / s, s, "same ids" if ids(eps) == ids(ref) else "DIFFERENT ids"))
            engine.close()
    finally:
        ray.shutdown()


def bench_schedule(args, loaded, specs, sampling, rows):
    from vagent.envs import make
    from vagent.rollout import HFPolicy, rollout

    def factory(spec):
        return SlowEnv(make(spec.name, **dict(spec.config)), args.delay if spec.seed % 2 else 0.0)

    out = {}
    for schedule in ("lockstep", "async"):
        policy = HFPolicy(loaded, batching=schedule == "async")
        rollout(specs[:2], policy, sampling, max_turns=1, env_factory=factory, schedule=schedule)  # warm-up
        t = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            eps = rollout(specs, policy, sampling, max_turns=args.turns, env_factory=factory, schedule=schedule)
            t.append(time.perf_counter() - t0)
        out[schedule] = (statistics.median(t), eps)
        if schedule == "async":
            policy.engine.close()
    same = ids(out["async"][1]) == ids(out["lockstep"][1])
    for schedule, (s, eps) in out.items():
        rows.append((f"{schedule}, half the envs +{args.delay:g} s/step", len(eps) / s, s,
                     "reference" if schedule == "lockstep" else ("same episodes" if same else "DIFFERENT episodes")))


def bench_overlap(args, rows):
    from vagent.runconfig import load_config
    from vagent.recipes.run import train

    tmp = Path(tempfile.mkdtemp(prefix="bench_overlap_"))
    base = [f"steps={args.steps}", "sft.steps=0", "val.every=0", "threads=1", f"model.cache_dir={tmp / 'cache'}",
            "model.tiny_pretrain_steps=0", "model.tiny_pretrain_relation_steps=0",
            f"envs.0.n_train={args.episodes}", "rollout.max_turns=2", f"rollout.max_new_tokens={args.max_new_tokens}",
            "rollout.replicas=1", "update.warmup_steps=0", "ppo.critic_warmup_steps=0", "log.tensorboard=false", "log.progress=false", "log.rollouts_every=0",
            "log.checkpoint_every=0", "log.plot_every=0", f"out_dir={tmp / 'runs'}"]
    for overlap in (0, 1):
        run_dir = train(load_config(None, base + [f"rollout.overlap={overlap}", f"name=overlap{overlap}"]), quiet=True)
        recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
        recs = [r for r in recs if r.get("phase") == "rl" and "perf/step_time_s" in r]
        per_step = (recs[-1]["time"] - recs[0]["time"]) / (len(recs) - 1)
        lags = sorted({r.get("rollout/weights_lag") for r in recs})
        rows.append((f"PPO overlap {overlap} (1 replica)", per_step, per_step,
                     f"weights lag {lags}, final reward/mean {recs[-1]['reward/mean']:.3f}"))


def bench_vllm(args, model_dir, loaded, specs, sampling, rows):
    from vagent.models.engine import HFEngine
    from vagent.models.vllm_engine import VLLMEngine
    from vagent.rollout import HFPolicy

    def timed(policy):
        return timed_rollout(policy, specs, sampling, args.turns, args.repeats)

    def tokens(eps):
        return sum(len(t.sampled_token_ids) for e in eps for t in e.turns)

    s0, ref = timed(HFPolicy(HFEngine(loaded.model, loaded.encoder)))
    rows.append(("HFEngine (in process)", len(ref) / s0, tokens(ref) / s0, s0, "-", "reference"))
    t0 = time.perf_counter()
    engine = VLLMEngine(model_dir, loaded.encoder, dtype="float32")
    engine.start()
    start = time.perf_counter() - t0
    try:
        s, eps = timed(HFPolicy(engine))
    finally:
        engine.close()
    rows.append(("VLLMEngine (in process, fp32)", len(eps) / s, tokens(eps) / s, s, f"{start:.1f}",
                 f"same ids; {s0 / s:.2f}x HF" if ids(eps) == ids(ref) else f"DIFFERENT ids; {s0 / s:.2f}x HF"))


def bench_train(args, rows):
    import subprocess
    import sys

    tmp = Path(tempfile.mkdtemp(prefix="bench_train_engine_"))
    base = ["sft.steps=0", "val.every=0", "log.tensorboard=false", "log.progress=false", "log.rollouts_every=0",
            "log.checkpoint_every=0", "log.plot_every=0", f"out_dir={tmp / 'runs'}"]
    root = Path(__file__).resolve().parents[1]

    def train(*extra):
        cmd = [sys.executable, "-m", "vagent", "train", *base, *extra]
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, cwd=root, capture_output=True, text=True)
        return time.perf_counter() - t0

    extra = list(args.train_override)
    train("steps=0", "name=build", *extra)  # the default tiny model (built once under model.cache_dir, untimed)
    for rnd in range(args.rounds):  # the engines' order alternates by round: a machine that drifts favours neither
        for engine in (("hf", "vllm") if rnd % 2 == 0 else ("vllm", "hf")):
            name = f"{engine}-r{rnd}"
            wall = train(f"steps={args.train_steps}", f"rollout.engine={engine}", f"name={name}", *extra)
            (run_dir,) = (tmp / "runs").glob(f"*{name}*")
            recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
            recs = [r for r in recs if "perf/step_time_s" in r]
            omp = json.loads((run_dir / "environment.json").read_text()).get("omp_wait_env", {})
            rows.append((engine, rnd, statistics.median(x["perf/step_time_s"] for x in recs), wall,
                         statistics.median(x["perf/generate_time_s"] for x in recs), step_parts(recs),
                         omp.get("OMP_WAIT_POLICY") or f"spin {omp.get('GOMP_SPINCOUNT')}", os.getloadavg()[0]))


def step_parts(recs: list[dict]) -> str:
    """Each RL step's time split (from its metrics): generate / the rest of the rollout / push and
    canary (what the step spent before its rollout and batch: the weight push, the canary's
    check) / scoring + update, and the batch's tokens."""
    out = []
    for r in recs:
        rollout, update = r["perf/rollout_time_s"], r["perf/update_time_s"]
        before = r["perf/step_time_s"] - rollout - update
        out.append(f"{r['perf/generate_time_s']:.2f} / {rollout - r['perf/generate_time_s']:.2f} / {before:.2f}"
                   f" (canary {r.get('sync/canary_s', 0.0):.2f}) / {update:.2f}, {r.get('rollout/batch_tokens', 0):.0f} tok")
    return "; ".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--episodes", type=int, default=16)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--delay", type=float, default=0.5, help="extra seconds per step of every second env")
    ap.add_argument("--replica-threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=5, help="PPO steps per overlap run")
    ap.add_argument("--train-steps", type=int, default=3, help="RL steps per run of --part train")
    ap.add_argument("--rounds", type=int, default=1, help="--part train: runs per engine, the order alternated")
    ap.add_argument("--train-override", action="append", default=[],
                    help="a config override of both --part train runs (repeatable), e.g. "
                         "model.tiny_pretrain_steps=0 to skip the tiny model's caption pretraining")
    ap.add_argument("--part", choices=["all", "replicas", "schedule", "overlap", "vllm", "train"], default="all",
                    help="all = replicas, schedule, overlap (the parts that need no vLLM)")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(1)
    from vagent.models import build_tiny_vlm, load_policy
    from vagent.rollout import EnvSpec, SamplingConfig

    model_dir = build_tiny_vlm(tempfile.mkdtemp(prefix="bench_engines_"), family="qwen3_vl", layers=3, image_size=128)
    loaded = load_policy(model_dir)
    env = {"format": "grounding_worldmodeling", "render": "vision", "image_size": 128, "description_style": "symbolic"}
    specs = [EnvSpec("frozenlake", env, 10_000 + s) for s in range(args.episodes)]
    sampling = SamplingConfig(temperature=0.0, max_new_tokens=args.max_new_tokens, stop=["</answer>"])
    rows: list[tuple] = []
    if args.part in ("all", "replicas"):
        bench_replicas(args, loaded, specs, sampling, rows)
    if args.part in ("all", "schedule"):
        bench_schedule(args, loaded, specs, sampling, rows)
    if rows:
        print(f"\n{args.episodes} episodes x {args.turns} turns, {args.max_new_tokens} new tokens/turn, greedy, "
              f"median of {args.repeats}, torch threads 1 per process")
        print("| setting | episodes/s | wall s | check |\n|---|---|---|---|")
        for name, rate, s, note in rows:
            print(f"| {name} | {rate:.2f} | {s:.2f} | {note} |")
    if args.part == "vllm":
        rows6: list = []
        bench_vllm(args, model_dir, loaded, specs, sampling, rows6)
        print(f"\n{args.episodes} episodes x {args.turns} turns, {args.max_new_tokens} new tokens/turn, greedy, "
              f"median of {args.repeats}")
        print("| engine | episodes/s | sampled tokens/s | rollout s | start-up s | check |\n|---|---|---|---|---|---|")
        for name, eps, tok, s, start, note in rows6:
            print(f"| {name} | {eps:.2f} | {tok:.0f} | {s:.2f} | {start} | {note} |")
    if args.part == "train":
        rows.clear()
        bench_train(args, rows)
        print(f"\nthe default run (configs/frozenlake_ppo.yaml), {args.train_steps} RL steps, sft.steps=0, val.every=0 "
              f"{' '.join(args.train_override)}; {args.rounds} round(s), the engines' order alternated")
        print("| round | engine | median step s | median generate s | wall s | per step: generate / rest of rollout / "
              "push + canary / scoring + update s, batch tokens | OpenMP wait | load after |\n|---|---|---|---|---|---|---|---|")
        for engine, r, step_s, wall, gen, parts, omp, load in rows:
            print(f"| {r} | {engine} | {step_s:.2f} | {gen:.2f} | {wall:.1f} | {parts} | {omp} | {load:.2f} |")
        ratios = [next(x[2] for x in rows if x[:2] == ("hf", r)) / next(x[2] for x in rows if x[:2] == ("vllm", r))
                  for r in range(args.rounds)]
        med = {e: statistics.median(x[2] for x in rows if x[0] == e) for e in ("hf", "vllm")}
        print(f"\nvllm step speed-up over hf by round: {', '.join(f'{q:.2f}x' for q in ratios)}; median step "
              f"hf {med['hf']:.2f} s, vllm {med['vllm']:.2f} s ({med['hf'] / med['vllm']:.2f}x)")
    if args.part in ("all", "overlap"):
        rows.clear()
        bench_overlap(args, rows)
        print(f"\nPPO, {args.steps} steps x {args.episodes} episodes, 2 turns, 1 HFEngine replica (Ray)")
        print("| setting | s per step (steps 1..N) | check |\n|---|---|---|")
        for name, _, s, note in rows:
            print(f"| {name} | {s:.2f} | {note} |")


if __name__ == "__main__":
    main()
