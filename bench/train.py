"""Training throughput: rollout tokens/s, update tokens/s and peak memory of PPO steps.

    python bench/train.py [--steps 4] [--repeats 1] [--threads 1] [--device cpu]

Three models, each in its own subprocess (so peak memory is that model's alone):

- ``vlm-h128``: the default tiny Qwen2.5-VL (hidden 128, 2 layers) on FrozenLake with images;
- ``vlm-h256``: a larger tiny VLM (hidden 256, 4 layers), same env;
- ``lm-h128``:  a text-only tiny LM (Qwen2, hidden 128, 2 layers) on FrozenLake's text render.

Each runs ``--steps`` PPO steps of the default preset's shape (8 envs, 4 turns, 48 new tokens,
bi-level GAE, 2 epochs x 2 mini-batches, critic) through ``vagent.recipes.run.train``; the first
step is a warm-up and is left out. Reported per model: the median over the remaining steps (and
``--repeats`` processes) of ``perf/rollout_tokens_per_s`` (sampled tokens / generation time),
``perf/update_tokens_per_s`` (tokens passed through forward+backward / update time, policy and
critic), ``perf/step_time_s``, and peak memory (CPU: max RSS of the process; CUDA:
``torch.cuda.max_memory_allocated``), with each throughput's ratio to ``vlm-h128`` measured in
the same run.
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
from pathlib import Path

MODELS = {
    "vlm-h128": dict(kind="vlm", hidden=128, layers=2),
    "vlm-h256": dict(kind="vlm", hidden=256, layers=4),
    "lm-h128": dict(kind="lm", hidden=128, layers=2),
}


def one(name: str, steps: int, threads: int, device: str, workdir: Path) -> dict:
    """Run ``steps`` PPO steps for model ``name`` in this process; return medians and peak memory."""
    import resource

    import torch

    from vagent.models.tiny import build_tiny_lm, build_tiny_vlm
    from vagent.runconfig import load_config
    from vagent.recipes.run import train
    from vagent.runs import read_metrics

    spec = MODELS[name]
    model_dir = workdir / name
    if spec["kind"] == "vlm":
        build_tiny_vlm(model_dir, hidden=spec["hidden"], layers=spec["layers"])
    else:
        build_tiny_lm(model_dir, hidden=spec["hidden"], layers=spec["layers"])
    overrides = [
        f"out_dir={workdir / 'runs'}", f"model.path={model_dir}", f"steps={steps}", f"threads={threads}",
        f"device={device}", "sft.steps=0", "val.every=0", "log.tensorboard=false", "log.progress=false",
        "log.rollouts_every=0", "log.checkpoint_every=0", "log.plot_every=0", "ppo.critic_warmup_steps=0",
    ]
    if spec["kind"] == "lm":
        overrides.append("envs.0.config.render=text")
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    run = train(load_config(None, overrides), quiet=True)
    recs = [r for r in read_metrics(run / "metrics.jsonl") if r["phase"] == "rl" and "perf/step_time_s" in r][1:]
    med = {k: statistics.median(r[k] for r in recs) for k in
           ("perf/rollout_tokens_per_s", "perf/update_tokens_per_s", "perf/step_time_s", "rollout/batch_tokens")}
    if device.startswith("cuda"):
        med["peak_mem_mb"] = torch.cuda.max_memory_allocated() / 2**20
    else:
        med["peak_mem_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    from vagent.models.loading import count_parameters, load_policy

    med["params_m"] = count_parameters(load_policy(model_dir).model) / 1e6
    return med


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=4, help="PPO steps per process (the first is a warm-up)")
    ap.add_argument("--repeats", type=int, default=1, help="processes per model")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--workdir", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print("RESULT " + json.dumps(one(args.one, args.steps, args.threads, args.device, Path(args.workdir))))
        return 0
    print("command: python bench/train.py " + " ".join(sys.argv[1:]))
    results: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in MODELS:
            for r in range(args.repeats):
                t0 = time.time()
                out = subprocess.run(
                    [sys.executable, __file__, "--one", name, "--steps", str(args.steps), "--threads",
                     str(args.threads), "--device", args.device, "--workdir", str(Path(tmp) / f"{name}-{r}")],
                    capture_output=True, text=True, env=dict(os.environ, TOKENIZERS_PARALLELISM="false"),
                )
                line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
                if out.returncode != 0 or not line:
                    print(out.stdout[-2000:], out.stderr[-4000:], file=sys.stderr)
                    return 1
                results.setdefault(name, []).append(json.loads(line[0][7:]))
                print(f"  {name} repeat {r}: {time.time() - t0:.0f}s", file=sys.stderr)
    rows = {n: {k: statistics.median(x[k] for x in rs) for k in rs[0]} for n, rs in results.items()}
    base = rows["vlm-h128"]
    print(f"| model | params | tokens/step | rollout tok/s | x base | update tok/s | x base | step s | peak MB |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n, r in rows.items():
        print(f"| {n} | {r['params_m']:.2f}M | {r['rollout/batch_tokens']:.0f} | {r['perf/rollout_tokens_per_s']:.0f} | "
              f"{r['perf/rollout_tokens_per_s'] / base['perf/rollout_tokens_per_s']:.2f} | "
              f"{r['perf/update_tokens_per_s']:.0f} | {r['perf/update_tokens_per_s'] / base['perf/update_tokens_per_s']:.2f} | "
              f"{r['perf/step_time_s']:.2f} | {r['peak_mem_mb']:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
