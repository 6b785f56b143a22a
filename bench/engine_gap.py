"""The engine/trainer log-prob gap of a bf16 engine beside an fp32 trainer, in one process, on one
device (CUDA or CPU): no Ray and no vLLM needed.

    PYTHONPATH=. python bench/engine_gap.py [--device cuda] [--model DIR] [--redraw SEED] [--json FILE]

The trainer is the policy loaded in float32. For each engine dtype (float32, bfloat16) an HF engine
(``vagent.models.engine.HFEngine``: batched generate with the KV cache, as the rollout samples)
runs on a copy of the trainer's weights cast to that dtype, and:

- samples ``--replies`` replies (temperature 1, ``--new-tokens`` each) to the first FrozenLake
  observation of as many boards (128 px images, the default run's format); the trainer scores the
  same tokens (one forward per reply, as ``vagent.rollout.canary.trainer_logprobs``), and the
  engine's sampling-time log-probs are compared with the trainer's: ``mismatch/*`` as a training
  step logs them (``vagent.rl.correction.mismatch_metrics``);
- runs the weight-push canary (``WeightCanary.check``: greedy replies to a 4-prompt probe, the
  largest |log-prob gap|, and its seconds) against that engine.

The fp32 row is the same-program gap (KV-cache decode vs one full forward); the bf16 row is what a
bf16 engine replica or vLLM engine adds. ``--redraw SEED`` re-draws the weights
(``vagent.models.tiny.redraw_weights``) so that a random-weight model gives peaked, image-dependent
distributions rather than near-uniform ones. ``scripts/gpu-check`` runs it on the scaled run's
caption-pretrained tiny model and on the Qwen2.5-VL-3B-shaped model.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import sys
import tempfile
import time
from pathlib import Path

ENV = {"format": "grounding_worldmodeling", "render": "vision", "image_size": 128, "description_style": "symbolic"}


def measure(model_dir: Path, device: str, replies: int, new_tokens: int, redraw: int | None,
            seed: int = 0) -> list[dict]:
    import torch

    from vagent.models.engine import GenerationRequest, HFEngine, SamplingParams
    from vagent.models.loading import count_parameters, load_policy
    from vagent.models.tiny import redraw_weights
    from vagent.rl.correction import mismatch_metrics
    from vagent.rollout import EnvSpec
    from vagent.rollout.canary import WeightCanary, build_probe, trainer_logprobs

    dev = torch.device(device)
    trainer = load_policy(model_dir, dtype="float32", device=dev)
    if redraw is not None:
        redraw_weights(trainer.model, redraw)
    specs = [EnvSpec("frozenlake", ENV, 30_000 + s) for s in range(replies)]
    prompts, _ = build_probe(specs, trainer.encoder, n=replies)
    requests = [GenerationRequest(list(p.input_ids), p.pixel_values, p.image_grid_thw, images=p.images, key=i)
                for i, p in enumerate(prompts)]
    params = SamplingParams(temperature=1.0, max_new_tokens=new_tokens, do_sample=True, seed=seed)
    rows = []
    for dtype in ("float32", "bfloat16"):
        engine_model = copy.deepcopy(trainer.model).to(getattr(torch, dtype))
        engine = HFEngine(engine_model, trainer.encoder)
        sync(dev)
        t0 = time.perf_counter()
        outs = engine.generate(requests, params)
        sync(dev)
        generate_s = time.perf_counter() - t0
        width = max(1, max(len(o.token_ids) for o in outs))
        eng = torch.zeros(len(outs), width)
        tra = torch.zeros(len(outs), width)
        mask = torch.zeros(len(outs), width, dtype=torch.bool)
        for i, (p, o) in enumerate(zip(prompts, outs)):
            n = len(o.token_ids)
            if n:
                eng[i, :n] = torch.tensor(o.logprobs)
                tra[i, :n] = torch.tensor(trainer_logprobs(trainer.model, p, o.token_ids))
                mask[i, :n] = True
        gap = mismatch_metrics(tra, eng, mask)
        canary = WeightCanary(prompts[:4], trainer.model, tolerance=math.inf).check(engine, 0)
        rows.append({"engine_dtype": dtype, "trainer_dtype": "float32", "device": device, "replies": len(outs),
                     "sampled_tokens": int(mask.sum()), "generate_s": round(generate_s, 3),
                     "params": count_parameters(trainer.model), "redraw": redraw,
                     **{k: float(v) for k, v in gap.items()}, **{k: float(v) for k, v in canary.items()}})
        del engine, engine_model
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def model_folder(path: Path) -> Path:
    """``path`` if it holds a model (config.json), else the newest model folder under it."""
    if (path / "config.json").is_file():
        return path
    found = sorted((c.parent for c in path.rglob("config.json")), key=lambda d: d.stat().st_mtime)
    if not found:
        raise SystemExit(f"engine_gap: no model folder (config.json) in or under {path}")
    return found[-1]


def sync(dev) -> None:
    import torch

    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--model", default=None, help="a vagent tiny-VLM folder, or a folder holding model folders (a "
                    "run's model.cache_dir: the newest is taken); default: a tiny model built here")
    ap.add_argument("--redraw", type=int, default=None, help="re-draw the weights with this seed first")
    ap.add_argument("--replies", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--json", default=None, help="also write the rows here")
    args = ap.parse_args()
    model = args.model
    if model is None:
        from vagent.models.tiny import build_tiny_vlm

        model = build_tiny_vlm(Path(tempfile.mkdtemp()) / "tiny", hidden=128, layers=3)
    rows = measure(model_folder(Path(model)), args.device, args.replies, args.new_tokens, args.redraw)
    print("| engine | trainer | tokens | mismatch/kl | mean abs dlogp | max abs dlogp | canary max gap | canary s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['engine_dtype']} | {r['trainer_dtype']} | {r['sampled_tokens']} | {r['mismatch/kl']:.3g} | "
              f"{r['mismatch/abs_logprob_diff_mean']:.3g} | {r['mismatch/abs_logprob_diff_max']:.3g} | "
              f"{r['sync/canary_max_abs_diff']:.3g} | {r['sync/canary_s']:.2f} |")
    print("ENGINE_GAP " + json.dumps(rows), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
