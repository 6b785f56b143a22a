"""Sampled tokens/s of HF generation through vagent's engine on a FrozenLake batch, CPU or CUDA.

    PYTHONPATH=. python bench/generation.py [--device cuda] [--model DIR] [--batches 8,32] [--json FILE]

One turn of the training rollout (``vagent.rollout.rollout`` with ``HFPolicy(HFEngine(...))``) on
``B`` FrozenLake boards (128 px images, the default run's format) at each batch size: the first
reply of every episode is sampled (temperature 1, no stop string, ``--new-tokens`` each). The
figure is sampled tokens / wall seconds of the rollout call (prefill + decode + the env's one
step), median of ``--repeats`` after one warm-up. ``--model`` is a vagent tiny-VLM folder
(``vagent.models.tiny.build_tiny_vlm``); without it a tiny model (hidden 128, 3 layers) is built.
On CUDA the model runs in bf16 (``--dtype``). This is the baseline the vLLM engine is measured
against (bench/rollout_engines.py); ``scripts/gpu-check`` runs it on the 3B-shaped model.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path


def measure(model_dir: Path, device: str, dtype: str, batches: list[int], new_tokens: int,
            repeats: int) -> list[dict]:
    import torch

    from vagent.models.engine import HFEngine
    from vagent.models.loading import count_parameters, load_policy
    from vagent.rollout import EnvSpec, HFPolicy, SamplingConfig, rollout

    loaded = load_policy(model_dir, dtype=dtype, device=torch.device(device))
    policy = HFPolicy(HFEngine(loaded.model, loaded.encoder))
    env = {"format": "grounding_worldmodeling", "render": "vision", "image_size": 128,
           "description_style": "symbolic"}
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=new_tokens, stop=[])
    n_params = count_parameters(loaded.model)
    rows = []
    for b in batches:
        specs = [EnvSpec("frozenlake", env, 20_000 + s) for s in range(b)]
        rollout(specs, policy, sampling, max_turns=1)  # warm-up (kernels, allocator)
        rates, tokens = [], 0
        for _ in range(repeats):
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            result = rollout(specs, policy, sampling, max_turns=1)
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            seconds = time.perf_counter() - t0
            tokens = sum(len(t.sampled_token_ids) for e in result for t in e.turns)
            rates.append(tokens / seconds)
        rows.append({"batch": b, "sampled_tokens": tokens, "tokens_per_s": statistics.median(rates),
                     "repeats": repeats, "params": n_params, "device": device, "dtype": dtype})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default=None, help="float32 / bfloat16 (default: bf16 on CUDA, fp32 on CPU)")
    ap.add_argument("--model", default=None, help="a tiny-VLM folder (default: build hidden 128 x 3 layers)")
    ap.add_argument("--batches", default="8,32", help="comma-separated batch sizes")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", default=None, help="also write the rows to this file")
    args = ap.parse_args()
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("bench/generation.py: --device cuda needs a CUDA device (none found)", file=sys.stderr)
        return 2
    dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    model = Path(args.model) if args.model else None
    if model is None:
        from vagent.models.tiny import build_tiny_vlm

        model = build_tiny_vlm(Path(tempfile.mkdtemp(prefix="bench-generation-")) / "tiny", family="qwen3_vl",
                               layers=3, image_size=128)
    rows = measure(model, args.device, dtype, [int(b) for b in args.batches.split(",")], args.new_tokens,
                   args.repeats)
    card = torch.cuda.get_device_name() if args.device.startswith("cuda") else "CPU"
    print(f"\nHF generation through HFEngine, {card}, {dtype}, {rows[0]['params'] / 1e6:,.1f}M params, "
          f"FrozenLake 128 px, {args.new_tokens} sampled tokens per reply, median of {args.repeats}")
    print("| batch | sampled tokens | tokens/s |\n|---|---|---|")
    for r in rows:
        print(f"| {r['batch']} | {r['sampled_tokens']} | {r['tokens_per_s']:,.0f} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
