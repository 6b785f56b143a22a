"""The engine/trainer mismatch of a bf16 engine beside an fp32 trainer, and what token-level
truncated IS does about it, on the default run (configs/frozenlake_ppo.yaml: caption-pretrained
tiny Qwen3-VL, SFT, 20 PPO steps, validation at steps 0/10/20).

Runs ``vagent train`` (one subprocess each, the same seed) with:

1. ``fp32``: one HF engine replica in float32 (``rollout.replicas=1``): the same-program gap;
2. ``bf16``: the replica in bfloat16 (``rollout.engine_dtype=bfloat16``), no correction;
3. ``bf16+tis``: the same with ``rollout_correction.is_level=token`` (C = 2).

and prints, per run: the mean over steps of ``mismatch/kl`` and ``mismatch/abs_logprob_diff_max``
(all tokens, and with / without an image in context), ``loss/clip_frac``, the validation success
at each validation step, the canary's gap and its share of the step time (``sync/canary_s`` /
``perf/step_time_s``), and the run's wall time. The tiny model's caption pretraining is cached
under ``model.cache_dir`` (the first run builds it).

Run:  PYTHONPATH=. .venv/bin/python bench/mismatch.py [--steps 20] [--runs fp32,bf16,bf16+tis]
      [--override key=value ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RUNS = {
    "fp32": ["rollout.replicas=1"],
    "bf16": ["rollout.replicas=1", "rollout.engine_dtype=bfloat16"],
    "bf16+tis": ["rollout.replicas=1", "rollout.engine_dtype=bfloat16", "rollout_correction.is_level=token"],
}


def mean_of(recs: list[dict], key: str) -> float:
    vals = [r[key] for r in recs if isinstance(r.get(key), (int, float))]
    return statistics.fmean(vals) if vals else float("nan")


def one_run(name: str, extra: list[str], workdir: Path, steps: int, overrides: list[str]) -> dict:
    out = workdir / name.replace("+", "_")
    cmd = [sys.executable, "-m", "vagent", "train", f"out_dir={out}", f"steps={steps}", "log.progress=false",
           "log.tensorboard=false", *RUNS[name], *overrides, *extra]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{name}: vagent train failed (rc {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    run_dir = next(out.iterdir())
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in recs if r.get("phase") == "rl" and "loss/policy" in r]
    val = {r["step"]: r["val/success_rate"] for r in recs if "val/success_rate" in r}
    share = [r["sync/canary_s"] / r["perf/step_time_s"] for r in rl if "sync/canary_s" in r]
    return {
        "run": name, "kl": mean_of(rl, "mismatch/kl"), "kl_image": mean_of(rl, "mismatch/kl_image"),
        "kl_text": mean_of(rl, "mismatch/kl_text"), "diff_max": mean_of(rl, "mismatch/abs_logprob_diff_max"),
        "clip_frac": mean_of(rl, "loss/clip_frac"), "is_truncated": mean_of(rl, "correction/is_truncated_frac"),
        "canary_gap": max((r.get("sync/canary_max_abs_diff", float("nan")) for r in rl), default=float("nan")),
        "canary_share": statistics.median(share) if share else float("nan"),
        "val": " / ".join(f"{val[k]:.3f}" for k in sorted(val)), "wall_min": wall / 60, "run_dir": str(run_dir),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--runs", default="fp32,bf16,bf16+tis")
    ap.add_argument("--override", action="append", default=[], help="extra key=value for every run")
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args()
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="vagent-mismatch-"))
    rows = []
    for name in args.runs.split(","):
        rows.append(one_run(name, [], workdir, args.steps, args.override))
        print(json.dumps(rows[-1]), flush=True)
    print("\n| run | mismatch/kl | _image | _text | max abs diff | loss/clip_frac | IS truncated | val success "
          "(steps 0/10/20) | canary max gap | canary / step | wall (min) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['run']} | {r['kl']:.2e} | {r['kl_image']:.2e} | {r['kl_text']:.2e} | {r['diff_max']:.3f} | "
              f"{r['clip_frac']:.4f} | {r['is_truncated']:.4f} | {r['val']} | {r['canary_gap']:.3g} | "
              f"{100 * r['canary_share']:.1f}% | {r['wall_min']:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
