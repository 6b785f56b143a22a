"""Benchmark the primitive_skill env: reset, one-skill step, the oracle, and rendering.

For each task (align, place, stack, drawer), over ``--seeds`` episodes:

1. ``reset`` with ``render="vision"`` (scene sampling + first 128 px frame) and ``render="text"``;
2. ``step`` of a one-skill reply (the oracle's next skill: parse + skill + stage rewards + frame);
3. ``optimal_actions()`` (the scripted planner, simulating its whole plan) from the start scene;
4. ``render_scene`` alone at 128 and 256 px.

Each figure is the median over episodes of the per-episode median of ``--repeats`` calls, in ms.
Baseline in the same run: FrozenLakeEnv ``step`` with ``render="vision"`` (96 px PIL tiles); the
ratio is primitive_skill's vision step time / FrozenLake's.

``--maniskill``: the ManiSkill backend (scripts/maniskill-env; run with .venv-maniskill/bin/python)
against the kinematic one on align, place and stack: over ``--seeds`` episodes each plays the
kinematic oracle's plan one skill a turn, with ``render="text"`` (steps/s) and ``render="vision"``
(image-steps/s: the step and its 128 px camera frame); reset times; ManiSkill's control steps per
skill and per second; the one-off cost of the first env (build and the first render, which compiles
lavapipe's pipelines). Figures are medians over all turns.

Run:  PYTHONPATH=. python bench/primitive_skill.py [--seeds 20] [--repeats 5]
      PYTHONPATH=. .venv-maniskill/bin/python bench/primitive_skill.py --maniskill [--seeds 3]
"""

from __future__ import annotations

import argparse
import copy
import math
import statistics
import time

from common import median_ms
from vagent.envs import make
from vagent.envs.formats import render_response
from vagent.envs.primitive_skill import render_scene


def _reply(answer: str) -> str:
    return render_response("no_think", {"answer": answer})


def _first_step_ms(env, repeats: int) -> float:
    """Median ms of the optimal first step from ``env``'s current (just reset) state: each repeat
    steps a fresh copy of that state, made before the clock starts."""
    reply = _reply(env.optimal_actions()[0])
    probes = iter([copy.deepcopy(env) for _ in range(repeats)])
    return median_ms(lambda: next(probes).step(reply), repeats)


def bench_task(task: str, seeds: int, repeats: int) -> dict[str, float]:
    out: dict[str, list[float]] = {k: [] for k in ("reset_vision", "reset_text", "step_vision", "step_text",
                                                  "oracle", "render_128", "render_256")}
    for render in ("vision", "text"):
        env = make("primitive_skill", task=task, format="no_think", render=render, max_actions_per_turn=1)
        for s in range(seeds):
            out[f"reset_{render}"].append(median_ms(lambda: env.reset(s), repeats))
            env.reset(s)
            out[f"step_{render}"].append(_first_step_ms(env, repeats))
            if render == "vision":
                out["oracle"].append(median_ms(env.optimal_actions, repeats))
                scene = env._backend.scene()
                out["render_128"].append(median_ms(lambda: render_scene(scene, 128), repeats))
                out["render_256"].append(median_ms(lambda: render_scene(scene, 256), repeats))
    return {k: statistics.median(v) for k, v in out.items()}


def bench_frozenlake(seeds: int, repeats: int) -> float:
    env = make("frozenlake", format="no_think", render="vision")
    per = []
    for s in range(seeds):
        env.reset(s)
        per.append(_first_step_ms(env, repeats))
    return statistics.median(per)


def _play_timed(env, seed: int, plan: list[str]) -> tuple[float, list[float]]:
    """(reset seconds, seconds of each one-skill step) playing ``plan`` from reset(seed)."""
    t = time.perf_counter()
    env.reset(seed)
    reset_s, steps = time.perf_counter() - t, []
    for action in plan:
        t = time.perf_counter()
        res = env.step(_reply(action))
        steps.append(time.perf_counter() - t)
        assert res.info["action_is_valid"], res.obs.text.splitlines()[0]
        if res.terminated:
            break
    assert res.info["success"], (env.config.task, seed)
    return reset_s, steps


def bench_maniskill(seeds: int) -> None:
    import platform

    t = time.perf_counter()
    first = make("primitive_skill", task="stack", backend="maniskill", render="vision", format="no_think")
    first.reset(0)
    print(f"first ManiSkill env in this process (build, reset, first 128 px render): {time.perf_counter() - t:.1f} s "
          f"({platform.processor() or platform.machine()})")
    first.close()
    for task in ("align", "place", "stack"):
        row: dict[str, float] = {}
        for backend in ("kinematic", "maniskill"):
            for render in ("text", "vision"):
                env = make("primitive_skill", task=task, backend=backend, render=render, format="no_think",
                           max_actions_per_turn=1)
                plan_env = make("primitive_skill", task=task, format="no_think")
                resets, steps = [], []
                sim0 = getattr(env._backend, "sim_steps", 0)
                for s in range(seeds):
                    plan_env.reset(s)
                    plan = plan_env.optimal_actions()
                    r, st = _play_timed(env, s, plan)
                    resets.append(r)
                    steps += st
                    if backend == "maniskill" and render == "text":  # where the objects end vs the kinematic plan
                        _play_timed(plan_env, s, plan)
                        want, got = plan_env.state()["objects"], env.state()["objects"]
                        row["dev_mm"] = max(row.get("dev_mm", 0.0), *(
                            math.dist(want[n]["position"][:2], got[n]["position"][:2]) for n in want))
                if backend == "maniskill" and render == "text":
                    sim = env._backend.sim_steps - sim0
                    row["sim_per_skill"] = sim / len(steps)
                    row["sim_per_s"] = sim / sum(steps)
                row[f"{backend}_{render}_sps"] = 1.0 / statistics.median(steps)
                row[f"{backend}_{render}_reset_ms"] = statistics.median(resets) * 1e3
                env.close()
        print(f"{task:6s} steps/s (one skill, text): kinematic {row['kinematic_text_sps']:.0f}, maniskill "
              f"{row['maniskill_text_sps']:.2f} ({row['kinematic_text_sps'] / row['maniskill_text_sps']:.0f}x) | "
              f"image-steps/s (128 px): kinematic {row['kinematic_vision_sps']:.0f}, maniskill "
              f"{row['maniskill_vision_sps']:.2f} ({row['kinematic_vision_sps'] / row['maniskill_vision_sps']:.0f}x) | "
              f"reset ms (vision): kinematic {row['kinematic_vision_reset_ms']:.2f}, maniskill "
              f"{row['maniskill_vision_reset_ms']:.0f} | ManiSkill control steps: {row['sim_per_skill']:.0f} per "
              f"skill, {row['sim_per_s']:.0f}/s | all {seeds} solved; objects end <= {row['dev_mm']:.1f} mm (xy) from "
              f"the kinematic prediction")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--maniskill", action="store_true", help="ManiSkill vs kinematic backend (align, place, stack)")
    args = ap.parse_args()
    if args.maniskill:
        bench_maniskill(args.seeds)
        return
    base = bench_frozenlake(args.seeds, args.repeats)
    print(f"baseline frozenlake step (vision 96 px): {base:.3f} ms")
    for task in ("align", "place", "stack", "drawer"):
        r = bench_task(task, args.seeds, args.repeats)
        print(f"{task:7s} reset vision {r['reset_vision']:.3f} ms, text {r['reset_text']:.3f} ms | "
              f"step vision {r['step_vision']:.3f} ms ({r['step_vision'] / base:.2f}x frozenlake), "
              f"text {r['step_text']:.3f} ms | oracle {r['oracle']:.3f} ms | "
              f"render 128 px {r['render_128']:.3f} ms, 256 px {r['render_256']:.3f} ms")


if __name__ == "__main__":
    main()
