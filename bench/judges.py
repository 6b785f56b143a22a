"""Benchmark of the reasoning judges: rule-judge throughput, LLM-judge throughput with batching on/off.

    python bench/judges.py [--repeats 5] [--n-rule 3000] [--n-llm 64] [--latency 0.02]

1. Rule judge: ``--n-rule`` judgments of descriptions of real FrozenLake and Sokoban states (the
   env's own descriptions in the three styles, and the same with directions mirrored), scored
   with the pure-Python Hungarian (baseline), scipy's solver for every matrix, and ``auto`` (the
   default: scipy only for matrices of >= 6 cells), judgments/s. The variants run interleaved
   (one of each per round) so machine load affects them alike.
2. LLM judge against the scripted OpenAI-compatible server in a SEPARATE process
   (``python -m vagent.rewards.scripted_server --latency L``: a model that takes L seconds per
   answer), ``--n-llm`` distinct prompts, cache off:
   - batching off (baseline): one ``score([item])`` call per item, in sequence;
   - batching on: one ``score(items)`` call for the batch, ``concurrency`` requests in flight.
Each figure is the median of ``--repeats`` runs; ratios are to the baseline of the same run.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

from vagent.envs import make
from vagent.rewards import JudgeItem, LLMJudge, LLMJudgeConfig, RuleJudge, RuleJudgeConfig
from vagent.rewards.base import env_judge_info


def mirrored(state: dict) -> dict:
    flip = {"above": "below", "below": "above", "left": "right", "right": "left"}
    return dict(state, relations=[dict(r, vertical=flip.get(r["vertical"], r["vertical"]),
                                       horizontal=flip.get(r["horizontal"], r["horizontal"]))
                                  for r in state["relations"]])


def rule_items(n: int) -> list[JudgeItem]:
    items: list[JudgeItem] = []
    seed = 0
    while len(items) < n:
        for name in ("frozenlake", "sokoban"):
            info = env_judge_info(name)
            env = make(name, render="text")
            env.reset(seed)
            st = env.state()
            for style in ("natural", "structured", "symbolic"):
                items.append(JudgeItem(info.describe_state(st, style), st, info.spec, legend=info.legend))
                if style != "symbolic":
                    items.append(JudgeItem(info.describe_state(mirrored(st), style), st, info.spec, legend=info.legend))
        seed += 1
    return items[:n]


def interleaved_medians(fns: dict, repeats: int) -> dict[str, float]:
    """Median wall time of each callable, running one of each per round."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def bench_rule(n: int, repeats: int) -> None:
    items = rule_items(n)
    print(f"rule judge: {len(items)} judgments (FrozenLake + Sokoban, 3 styles, correct + mirrored), "
          f"median of {repeats}")
    judges = {m: RuleJudge(RuleJudgeConfig(matcher=m)) for m in ("python", "scipy", "auto")}
    t = interleaved_medians({m: (lambda j=j: j.score(items)) for m, j in judges.items()}, repeats)
    print(f"  matcher python (baseline): {len(items) / t['python']:8.0f} judgments/s")
    for m in ("scipy", "auto"):
        print(f"  matcher {m:6s}:            {len(items) / t[m]:8.0f} judgments/s   x{t['python'] / t[m]:.2f}")


def start_server(latency: float) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "vagent.rewards.scripted_server", "--latency", str(latency)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline()
    if not line.startswith("PORT "):
        proc.kill()
        raise RuntimeError(f"scripted server did not start: {line!r}")
    return proc, f"http://127.0.0.1:{int(line.split()[1])}/v1"


def bench_llm(n: int, repeats: int, latency: float, concurrency: int) -> None:
    proc, url = start_server(latency)
    try:
        info = env_judge_info("frozenlake")
        env = make("frozenlake", render="text")
        env.reset(0)
        st = env.state()
        run_id = [0]

        def items() -> list[JudgeItem]:  # distinct prompts each run: nothing is served from any cache
            run_id[0] += 1
            return [JudgeItem(f"Run {run_id[0]}, item {i}: the goal is below you.", st, info.spec, legend=info.legend)
                    for i in range(n)]

        cfg = LLMJudgeConfig(base_url=url, model="scripted", cache_size=0, concurrency=concurrency)
        judge = LLMJudge(cfg)
        judge.score(items()[:2])  # warm-up: imports, first connection

        def off() -> None:
            for it in items():
                r = judge.score([it])
                assert not r[0].fallback, r[0].detail

        def on() -> None:
            rs = judge.score(items())
            assert not any(r.fallback for r in rs), [r.detail for r in rs if r.fallback][:1]

        t = interleaved_medians({"off": off, "on": on}, repeats)
        t_off, t_on = t["off"], t["on"]
        print(f"llm judge: {n} prompts to a scripted server in another process answering after {latency * 1000:.0f} ms, "
              f"cache off, median of {repeats}")
        print(f"  batching off (one score() per item, baseline): {n / t_off:8.1f} judgments/s")
        print(f"  batching on (one score() per batch, concurrency {concurrency}): {n / t_on:8.1f} judgments/s"
              f"   x{t_off / t_on:.1f}")
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--n-rule", type=int, default=3000)
    p.add_argument("--n-llm", type=int, default=64)
    p.add_argument("--latency", type=float, default=0.02, help="scripted server answer delay in seconds")
    p.add_argument("--concurrency", type=int, default=32)
    args = p.parse_args()
    bench_rule(args.n_rule, args.repeats)
    bench_llm(args.n_llm, max(3, args.repeats // 2 + 1), args.latency, args.concurrency)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
