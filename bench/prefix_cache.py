"""Benchmark HFEngine's prefix reuse on a validation-like multi-turn rollout.

Plays ``--envs`` FrozenLake episodes (the default preset's env: 128 px images, the
grounding_worldmodeling format, symbolic descriptions) for up to ``--turns`` turns in concat
mode, greedy, with the same model twice per repeat:

- ``baseline``: ``HFEngine(prefix_cache=False)`` -- HF ``generate``, every turn prefills the whole
  conversation so far;
- ``prefix``: ``HFEngine(prefix_cache=True)`` -- each turn feeds only the tokens its cache lacks.

Prints the median wall time of ``--repeats`` runs of each (after one warm-up of each), the
ratio baseline / prefix, the share of prompt tokens taken from the cache, and whether the two
played the same episodes (greedy: they should, up to float near-ties).

Run:  PYTHONPATH=. python bench/prefix_cache.py [--model DIR] [--envs 64] [--turns 4] [--repeats 3]

``--model`` defaults to a fresh random tiny VLM (3 layers); a trained policy (e.g. a run's
``checkpoints/step_000020/policy``) plays realistic replies and episode lengths.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="model directory (default: a fresh tiny VLM)")
    ap.add_argument("--envs", type=int, default=64)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0 = torch's default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    from vagent.models import HFEngine, build_tiny_vlm, load_policy
    from vagent.rollout import EnvSpec, HFPolicy, SamplingConfig, rollout

    model_dir = args.model or build_tiny_vlm(tempfile.mkdtemp(prefix="bench_prefix_"), family="qwen3_vl",
                                             layers=3, image_size=128)
    loaded = load_policy(model_dir)
    env = {"format": "grounding_worldmodeling", "render": "vision", "image_size": 128,
           "description_style": "symbolic"}
    specs = [EnvSpec("frozenlake", env, 10_000 + seed) for seed in range(args.envs)]
    sampling = SamplingConfig(temperature=0.0, max_new_tokens=args.max_new_tokens, stop=["</answer>"])

    def play(prefix_cache: bool):
        engine = HFEngine(loaded.model, loaded.encoder, prefix_cache=prefix_cache)
        t0 = time.perf_counter()
        eps = rollout(specs, HFPolicy(engine), sampling, max_turns=args.turns)
        return time.perf_counter() - t0, eps, engine.stats

    times: dict[bool, list[float]] = {False: [], True: []}
    played: dict[bool, list] = {}
    for rep in range(args.repeats + 1):
        for mode in (False, True):
            seconds, eps, stats = play(mode)
            if rep:  # the first round warms up
                times[mode].append(seconds)
            played[mode] = eps
            if mode:
                prefix_stats = stats
    base, fast = statistics.median(times[False]), statistics.median(times[True])
    turns = sum(len(e.turns) for e in played[True])
    same = sum([t.sampled_token_ids for t in a.turns] == [t.sampled_token_ids for t in b.turns]
               for a, b in zip(played[False], played[True]))
    print(f"model: {model_dir}")
    print(f"{args.envs} episodes x <= {args.turns} turns (concat, greedy, <= {args.max_new_tokens} new tokens); "
          f"{turns} turns played; torch threads {torch.get_num_threads()}")
    print(f"baseline (HF generate, full prefill): median {base:.2f} s  runs {[round(t, 2) for t in times[False]]}")
    print(f"prefix cache:                         median {fast:.2f} s  runs {[round(t, 2) for t in times[True]]}")
    print(f"speed-up baseline / prefix: {base / fast:.2f}x; prompt tokens from the cache: "
          f"{prefix_stats['reused_tokens'] / max(prefix_stats['prompt_tokens'], 1):.1%}")
    print(f"identical episodes: {same}/{len(specs)}")


if __name__ == "__main__":
    main()
