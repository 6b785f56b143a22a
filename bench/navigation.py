"""Benchmark the navigation env: raycast render time per frame, env reset/step, BFS planning.

1. ``raycast.render`` of the start view of ``--seeds`` generated rooms (default 6 objects,
   3-5 m rooms) at 64, 96 and 128 px, plus the same poses looking down 30 degrees: the median over
   poses of the per-pose median of ``--repeats`` calls.
2. Env throughput with ``render="vision"`` (96 px) and ``render="text"``: ``reset`` (room
   generation, BFS check, first frame) and ``step`` of a one-action reply (parse + move + render +
   state), median ms per call over ``--seeds`` episodes.
3. ``optimal_actions()`` (BFS over (cell, yaw)) from the start pose, median ms.

Baseline in the same run: FrozenLakeEnv ``step`` with ``render="vision"`` (96 px PIL tiles);
the ratio is navigation's step time / FrozenLake's.

Run:  PYTHONPATH=. python bench/navigation.py [--seeds 20] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from common import median_ms
from vagent.envs import make
from vagent.envs.formats import render_response
from vagent.envs.navigation import Pose, RoomParams, generate_room
from vagent.envs.navigation.raycast import render


def _reply(action: str) -> str:
    return render_response("no_think", {"answer": action})


def bench_render(seeds: int, repeats: int) -> dict:
    rooms = [generate_room(np.random.default_rng(s), RoomParams()) for s in range(seeds)]
    out = {}
    for size in (64, 96, 128):
        for pitch in (0, 30):
            per_pose = [median_ms(lambda r=room, p=pose: render(r, Pose(p.ix, p.iz, p.yaw, pitch), size), repeats)
                        for room, _, pose in rooms]
            out[f"{size}px_pitch{pitch}"] = statistics.median(per_pose)
            print(f"  render {size:3d} px, pitch {pitch:2d}: median {statistics.median(per_pose):6.2f} ms "
                  f"(max over poses {max(per_pose):6.2f} ms, {seeds} poses x {repeats} repeats)")
    return out


def bench_env(name: str, seeds: int, action: str, **config) -> tuple[float, float]:
    env = make(name, format="no_think", **config)
    resets, steps = [], []
    for s in range(seeds):
        t = time.perf_counter()
        env.reset(s)
        resets.append(time.perf_counter() - t)
        for _ in range(5):
            t = time.perf_counter()
            res = env.step(_reply(action))
            steps.append(time.perf_counter() - t)
            if res.terminated or res.truncated:
                break
    return statistics.median(resets) * 1e3, statistics.median(steps) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    print("== raycast render (one frame)")
    bench_render(args.seeds, args.repeats)
    print("== env reset / step (one-action reply)")
    results = {}
    for render_mode in ("vision", "text"):
        r, s = bench_env("navigation", args.seeds, "rotateright", render=render_mode)
        results[render_mode] = s
        print(f"  navigation {render_mode:6s}: reset median {r:6.2f} ms, step median {s:6.2f} ms")
    r, s = bench_env("frozenlake", args.seeds, "Left", render="vision")
    print(f"  frozenlake vision (baseline): reset median {r:6.2f} ms, step median {s:6.2f} ms")
    print(f"  ratio navigation vision step / frozenlake vision step: {results['vision'] / s:5.2f}x")
    env = make("navigation", render="text")
    plans = []
    for seed in range(args.seeds):
        env.reset(seed)
        plans.append(median_ms(env.optimal_actions, args.repeats))
    print(f"== BFS optimal_actions from the start: median {statistics.median(plans):6.2f} ms "
          f"(max {max(plans):6.2f} ms)")


if __name__ == "__main__":
    main()
