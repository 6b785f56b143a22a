"""Packed vs padded forwards (``update.packing``): update and scoring tokens/s, and peak memory.

Two batches, each timed padded and packed in the same run (ratios printed), each mode in its own
subprocess so that its peak resident memory (``ru_maxrss``) is its own:

- ``default``: the default run's batch shape: the tiny Qwen3-VL of configs/frozenlake_ppo.yaml
  (hidden 128, 3 layers, 128 px images), one rollout of its 16 FrozenLake boards (4 turns, 96 new
  tokens, temperature 0.7; random weights, so replies run long), micro_batch_tokens 1024;
- ``ragged``: 32 synthetic rows of 64-2048 tokens (uniform), a 128 px image in every other row,
  the last quarter of each row trained on, micro_batch_tokens 8192 (the config default).

Scoring = ``score_logprobs`` (no grad, the old log-probs pass); update = forward + backward of the
actor's log-probs and entropy over the same micro-batches. Tokens/s count real (non-pad) tokens.

    python bench/packing.py [--rounds 3] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def default_batch(model_dir: Path):
    import torch

    from vagent.models.loading import load_policy
    from vagent.rollout import EnvSpec, HFPolicy, SamplingConfig, rollout
    from vagent.rollout.batch import build_token_batch

    loaded = load_policy(model_dir)
    cfg = {"format": "grounding_worldmodeling", "render": "vision", "image_size": 128, "description_style": "symbolic"}
    specs = [EnvSpec("frozenlake", cfg, s) for s in range(16)]
    torch.manual_seed(0)
    eps = rollout(specs, HFPolicy(loaded), SamplingConfig(temperature=0.7, max_new_tokens=96, seed=0), max_turns=4)
    eps = [e for e in eps if e.error is None]
    return loaded, build_token_batch(eps, mode="concat", pad_token_id=loaded.encoder.pad_token_id), 1024


def ragged_batch(model_dir: Path, rows: int = 32):
    import numpy as np
    import torch
    from PIL import Image

    from vagent.models.loading import load_policy
    from vagent.rollout.batch import TokenBatch

    loaded = load_policy(model_dir)
    enc = loaded.encoder
    g = torch.Generator().manual_seed(0)
    rng = np.random.default_rng(0)
    seqs, pixels, grids, n_images = [], [], [], []
    for b in range(rows):
        n = int(torch.randint(64, 2049, (1,), generator=g))
        head: list[int] = []
        if b % 2 == 0:
            img = Image.fromarray(rng.integers(0, 256, (128, 128, 3), dtype=np.uint8))
            seg = enc.encode_user("<image>", [img])
            head = list(seg.input_ids)
            pixels.append(seg.pixel_values)
            grids.append(seg.image_grid_thw)
        body = torch.randint(10, 2000, (max(1, n - len(head)),), generator=g).tolist()
        seqs.append(head + body)
        n_images.append(1 if b % 2 == 0 else 0)
    L = max(len(s) for s in seqs)
    ids = torch.full((rows, L), enc.pad_token_id)
    mask = torch.zeros((rows, L), dtype=torch.long)
    loss = torch.zeros((rows, L), dtype=torch.bool)
    for b, s in enumerate(seqs):
        ids[b, :len(s)] = torch.tensor(s)
        mask[b, :len(s)] = 1
        loss[b, len(s) - len(s) // 4:len(s)] = True
    zeros = torch.zeros((rows, L))
    batch = TokenBatch(
        input_ids=ids, attention_mask=mask, loss_mask=loss, old_logprobs=zeros, turn_end_mask=loss.clone(),
        token_rewards=zeros, turn_index=torch.full((rows, L), -1), bootstrap_index=torch.full((rows,), -1),
        truncated=torch.zeros(rows, dtype=torch.bool), scores=torch.zeros(rows), group_ids=torch.arange(rows),
        traj_ids=torch.arange(rows), row_turn=torch.full((rows,), -1), pixel_values=torch.cat(pixels),
        image_grid_thw=torch.cat(grids), state_keys=[[] for _ in range(rows)], n_images=torch.tensor(n_images),
        episode_index=torch.arange(rows))
    return loaded, batch, 8192


def one(kind: str, packed: bool, model_dir: Path, rounds: int, threads: int) -> dict:
    """Time one batch kind in one mode (this process): the best of ``rounds`` of each pass."""
    import torch

    from vagent.distributed import micro_batch_rows
    from vagent.recipes.scoring import policy_forward, score_logprobs

    torch.set_num_threads(threads)
    loaded, batch, budget = (default_batch if kind == "default" else ragged_batch)(model_dir)
    model, tokens = loaded.model, batch.num_tokens
    groups = micro_batch_rows(batch, budget)
    score_s, update_s = [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        score_logprobs(model, None, batch, budget, 1024, 0.7, packed)
        score_s.append(time.perf_counter() - t0)
        model.train()
        t0 = time.perf_counter()
        for rows in groups:
            mb = batch.select(rows)
            lp, ent = policy_forward(model, mb, 1024, with_entropy=True, temperature=0.7, packed=packed)
            ((lp * mb.loss_mask).sum() + 0.001 * (ent * mb.loss_mask).sum()).backward()
        model.zero_grad(set_to_none=True)
        update_s.append(time.perf_counter() - t0)
    padded_positions = sum(len(g) * int(batch.lengths[g].max()) for g in groups)
    return {"tokens": tokens, "rows": batch.batch_size, "micro_batches": len(groups), "budget": budget,
            "padded_positions": padded_positions, "score_tok_s": tokens / min(score_s),
            "update_tok_s": tokens / min(update_s),
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--one", nargs=3, metavar=("KIND", "PACKED", "MODEL_DIR"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        kind, packed, model_dir = args.one
        print(json.dumps(one(kind, packed == "1", Path(model_dir), args.rounds, args.threads)))
        return
    from vagent.models.tiny import build_tiny_vlm

    model_dir = build_tiny_vlm(Path(tempfile.mkdtemp()) / "tiny", family="qwen3_vl", hidden=128, layers=3,
                               image_size=128, rope_theta=100, seed=0)
    print(f"machine: {_cpu()} ({platform.machine()}), {args.threads} threads, best of {args.rounds}")
    for kind in ("default", "ragged"):
        res = {}
        for packed in (False, True):
            out = subprocess.run([sys.executable, __file__, "--one", kind, str(int(packed)), str(model_dir),
                                  "--rounds", str(args.rounds), "--threads", str(args.threads)],
                                 capture_output=True, text=True, check=True)
            res[packed] = json.loads(out.stdout.strip().splitlines()[-1])
        a, b = res[False], res[True]
        print(f"{kind}: {a['rows']} rows, {a['tokens']} tokens ({a['padded_positions']} padded positions), "
              f"{a['micro_batches']} micro-batches of <= {a['budget']}")
        for key, label in (("update_tok_s", "update tokens/s"), ("score_tok_s", "scoring tokens/s")):
            print(f"  {label:17s} padded {a[key]:9.0f}   packed {b[key]:9.0f}   packed/padded {b[key] / a[key]:.2f}x")
        print(f"  peak RSS MB       padded {a['peak_rss_mb']:9.0f}   packed {b['peak_rss_mb']:9.0f}")


def _cpu() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


if __name__ == "__main__":
    main()
