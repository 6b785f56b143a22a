"""Benchmark ``vagent view`` on a big token dump: read (``--max-token-mb`` above its size) vs capped
(the default 64 MB: the dump is left unread and its episodes say so).

Writes a run directory with ``rollouts/step_000001.jsonl`` (8 episodes) and a synthetic
``step_000001.tokens.json`` of about ``--mb`` MB (rows of 8192 tokens with logprobs, advantages,
values and returns, as ``vagent.runs.tokens`` writes them), then, in a fresh Python process per
repeat (so peak memory is that of one request), times the first answer of one episode:
``RunSource(run, max_token_mb).episode("step_000001", 0)``, and reads the process's peak RSS.
Medians over ``--repeats``; the ratio is read / capped.

Run:  PYTHONPATH=. python bench/viewer.py [--mb 200] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = """
import json, resource, sys, time
from pathlib import Path
from vagent.viewer.data import RunSource
t0 = time.perf_counter()
ep = RunSource(Path(sys.argv[1]), float(sys.argv[2])).episode("step_000001", 0)
dt = time.perf_counter() - t0
print(json.dumps({"s": dt, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "tokens": ep["token_data"] is not None}))
"""


def write_run(root: Path, mb: float) -> float:
    """The run directory; returns the token dump's size in MB."""
    rng = random.Random(0)
    rollouts = root / "rollouts"
    rollouts.mkdir(parents=True)
    turn = {"index": 0, "observation": "obs", "frames": [], "reply": "<answer>Up</answer>",
            "parsed": {"actions": ["Up"]}, "format_ok": True, "reward": 0.0, "env_reward": 0.0}
    rec = {"env_name": "frozenlake", "seed": 0, "success": False, "total_reward": 0.0, "turns": [turn]}
    (rollouts / "step_000001.jsonl").write_text("".join(json.dumps({**rec, "seed": s}) + "\n" for s in range(8)))
    L = 8192
    floats = [round(rng.uniform(-3, 0), 7) for _ in range(L)]
    row = {"row": 0, "episode": 0, "traj_id": 0, "group_id": 0, "row_turn": 0, "truncated": False,
           "bootstrap_index": -1, "n_images": 0, "length": L, "input_ids": [rng.randrange(150_000) for _ in range(L)],
           "loss_mask": [int(i % 3 == 0) for i in range(L)], "turn_index": [0 if i % 3 == 0 else -1 for i in range(L)],
           "sample_logprobs": floats, "logprobs": floats, "advantages": floats, "values": floats, "returns": floats}
    one = len(json.dumps(row, separators=(",", ":")))
    n = max(1, int(mb * 1e6 / one))
    rows = [{**row, "row": r, "episode": r % 8} for r in range(n)]
    doc = {"schema": 1, "step": 1, "image_token_id": None, "pad_token_id": 0, "eos_token_ids": [2],
           "pieces": {str(i): f"t{i}" for i in set(row["input_ids"])},
           "fields": ["logprobs", "advantages", "values", "returns"], "rows": rows}
    path = rollouts / "step_000001.tokens.json"
    path.write_text(json.dumps(doc, separators=(",", ":")))
    return path.stat().st_size / 1e6


def measure(root: Path, cap_mb: float, repeats: int) -> dict:
    runs = []
    for _ in range(repeats):
        out = subprocess.run([sys.executable, "-c", CHILD, str(root), str(cap_mb)], capture_output=True, text=True,
                             check=True)
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return {"s": statistics.median(r["s"] for r in runs), "rss_mb": statistics.median(r["rss_mb"] for r in runs),
            "tokens": runs[0]["tokens"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=200.0)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        size = write_run(Path(tmp) / "run", args.mb)
        capped = measure(Path(tmp) / "run", 64.0, args.repeats)
        read = measure(Path(tmp) / "run", size + 1, args.repeats)
    print(f"token dump {size:.0f} MB; first episode answer, median of {args.repeats} fresh processes:")
    print(f"  capped (--max-token-mb 64, not read): {capped['s']:.2f} s, peak RSS {capped['rss_mb']:.0f} MB, "
          f"tokens shown: {capped['tokens']}")
    print(f"  read   (--max-token-mb {size + 1:.0f}):          {read['s']:.2f} s, peak RSS {read['rss_mb']:.0f} MB, "
          f"tokens shown: {read['tokens']}")
    ratio_s, ratio_mb = read["s"] / capped["s"], read["rss_mb"] / capped["rss_mb"]
    print(f"  read / capped: {ratio_s:.0f}x the time, {ratio_mb:.1f}x the memory")


if __name__ == "__main__":
    main()
