"""Packed vs padded forwards (``update.packing``): update and scoring tokens/s, and peak memory.

Two batches, each timed padded and packed in the same run (ratios printed, with the machine and
the load average), each mode in its own subprocess so that its peak resident memory
(``ru_maxrss``) is its own:

- ``run``: the real rows of a run's token dumps (``rollouts/step_*.tokens.json``, written every
  ``log.rollouts_every`` steps for the first ``log.rollouts_n`` episodes; all dumped rows as one
  batch), with the run's micro_batch_tokens and rollout temperature, on a tiny model built from the
  run's ``model.tiny_*`` settings (timing does not depend on the weights). The dumps hold token ids,
  not pixels: each image placeholder run gets a random image of the run's ``image_size`` (checked
  to give the same number of placeholders). ``--run DIR`` names the run; without it the bench first
  makes one: the default run scaled down (configs/frozenlake_ppo.yaml with 12 + 8 caption steps,
  4 SFT steps and 1 RL step on its 16 boards, every row dumped; about two minutes on two cores),
  whose barely trained policy writes longer replies than the full run's;
- ``ragged``: 32 synthetic rows of 64-2048 tokens (uniform), a 128 px image in every other row,
  the last quarter of each row trained on, micro_batch_tokens 8192 (the config default), on the
  default run's tiny Qwen3-VL.

Scoring = ``score_logprobs`` (no grad, the old log-probs pass); update = forward + backward of the
actor's log-probs and entropy over the same micro-batches. Tokens/s count real (non-pad) tokens.

    python bench/packing.py [--run RUN_DIR] [--budget TOKENS] [--rounds 3] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import cpu_name

#: the default run scaled down (as tests/recipes/test_reproducible.py's SCALED), every row of one step dumped
SCALED_RUN = ["model.tiny_pretrain_steps=12", "model.tiny_pretrain_relation_steps=8", "sft.steps=4",
              "sft.demos_per_env=12", "steps=1", "envs.0.n_val=4", "val.every=0", "log.rollouts_every=1",
              "log.rollouts_n=16", "log.checkpoint_every=0", "log.plot_every=0", "log.progress=false",
              "log.tensorboard=false"]


def _token_batch(seqs: list[list[int]], loss_masks: list[list[int]], pixels: list, grids: list,
                 n_images: list[int], pad_token_id: int):
    """A right-padded ``TokenBatch`` of token rows ``seqs`` (their loss masks alongside); pixels /
    grids: the images of all rows in row order (as the rollout batch holds them)."""
    import torch

    from vagent.rollout.batch import TokenBatch

    rows, L = len(seqs), max(len(s) for s in seqs)
    ids = torch.full((rows, L), pad_token_id)
    mask = torch.zeros((rows, L), dtype=torch.long)
    loss = torch.zeros((rows, L), dtype=torch.bool)
    for b, (s, m) in enumerate(zip(seqs, loss_masks)):
        ids[b, :len(s)] = torch.tensor(s)
        mask[b, :len(s)] = 1
        loss[b, :len(s)] = torch.tensor(m, dtype=torch.bool)
    zeros = torch.zeros((rows, L))
    return TokenBatch(
        input_ids=ids, attention_mask=mask, loss_mask=loss, old_logprobs=zeros, turn_end_mask=loss.clone(),
        token_rewards=zeros, turn_index=torch.full((rows, L), -1), bootstrap_index=torch.full((rows,), -1),
        truncated=torch.zeros(rows, dtype=torch.bool), episode_returns=torch.zeros(rows), group_ids=torch.arange(rows),
        traj_ids=torch.arange(rows), row_turn=torch.full((rows,), -1),
        pixel_values=torch.cat(pixels) if pixels else None, image_grid_thw=torch.cat(grids) if grids else None,
        state_keys=[[] for _ in range(rows)], n_images=torch.tensor(n_images), episode_index=torch.arange(rows))


def _image(encoder, size: int, seed: int):
    """(placeholder ids, pixel_values, image_grid_thw) of a random ``size`` px image."""
    import numpy as np
    from PIL import Image

    img = Image.fromarray(np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8))
    seg = encoder.encode_user("<image>", [img])
    return seg.input_ids, seg.pixel_values, seg.image_grid_thw


def _placeholder_runs(ids: list[int], image_token_id: int) -> list[int]:
    """Lengths of the runs of consecutive ``image_token_id`` in ``ids`` (one run per image)."""
    runs: list[int] = []
    prev = None
    for t in ids:
        if t == image_token_id:
            if prev == image_token_id:
                runs[-1] += 1
            else:
                runs.append(1)
        prev = t
    return runs


def run_batch(run_dir: Path, model_dir: Path, budget: int | None = None):
    """(loaded policy, TokenBatch of every row of the run's token dumps, micro_batch_tokens (``budget``
    or the run's), temperature)."""
    import yaml

    from vagent.models.loading import load_policy
    from vagent.runs.tokens import read_token_rows

    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    loaded = load_policy(model_dir)
    size = int(cfg["envs"][0]["config"].get("image_size", 128))
    _, pv, grid = image = _image(loaded.encoder, size, 0)
    per_image = _placeholder_runs(image[0], loaded.encoder.image_token_id)[0]
    seqs, losses, pixels, grids, n_images = [], [], [], [], []
    for path in sorted((run_dir / "rollouts").glob("step_*.tokens.json")):
        doc = read_token_rows(path)
        for r in doc.get("rows", []):
            runs = _placeholder_runs(r["input_ids"], doc["image_token_id"])
            if any(n != per_image for n in runs) or len(runs) != r["n_images"]:
                raise ValueError(f"{path} row {r['row']}: image placeholder runs {runs} for {r['n_images']} images, "
                                 f"but a {size} px image gives {per_image}; is the run's envs.0.config.image_size "
                                 f"{size}, and its model the one model.tiny_* describes?")
            seqs.append(r["input_ids"])
            losses.append(r["loss_mask"])
            pixels += [pv] * len(runs)
            grids += [grid] * len(runs)
            n_images.append(len(runs))
    if not seqs:
        raise ValueError(f"{run_dir}/rollouts holds no token dump rows (step_*.tokens.json); "
                         "train with log.rollouts_every > 0")
    batch = _token_batch(seqs, losses, pixels, grids, n_images, loaded.encoder.pad_token_id)
    temperature = float(cfg["rollout"]["temperature"]) or 1.0
    return loaded, batch, budget or int(cfg["update"]["micro_batch_tokens"]), temperature


def ragged_batch(model_dir: Path, rows: int = 32):
    """(loaded policy, the synthetic ragged TokenBatch (module docstring), 8192, temperature 0.7)."""
    import torch

    from vagent.models.loading import load_policy

    loaded = load_policy(model_dir)
    enc = loaded.encoder
    g = torch.Generator().manual_seed(0)
    seqs, losses, pixels, grids, n_images = [], [], [], [], []
    for b in range(rows):
        n = int(torch.randint(64, 2049, (1,), generator=g))
        head: list[int] = []
        if b % 2 == 0:
            head, pv, grid = _image(enc, 128, b)
            pixels.append(pv)
            grids.append(grid)
        body = torch.randint(10, 2000, (max(1, n - len(head)),), generator=g).tolist()
        seq = head + body
        seqs.append(seq)
        losses.append([0] * (len(seq) - len(seq) // 4) + [1] * (len(seq) // 4))
        n_images.append(1 if b % 2 == 0 else 0)
    return loaded, _token_batch(seqs, losses, pixels, grids, n_images, enc.pad_token_id), 8192, 0.7


def _passes(model, batch, budget: int, temperature: float, packed: bool) -> tuple[float, float]:
    """Seconds of one scoring pass and one update pass (forward + backward over the micro-batches)."""
    from vagent.distributed import micro_batch_rows
    from vagent.recipes.scoring import ScoringPass, policy_forward, score_logprobs

    t0 = time.perf_counter()
    score_logprobs(model, None, batch, ScoringPass(budget, 1024, temperature, packed))
    score_s = time.perf_counter() - t0
    model.train()
    t0 = time.perf_counter()
    for rows in micro_batch_rows(batch, budget):
        mb = batch.select(rows)
        lp, ent = policy_forward(model, mb, 1024, with_entropy=True, temperature=temperature, packed=packed)
        ((lp * mb.loss_mask).sum() + 0.001 * (ent * mb.loss_mask).sum()).backward()
    model.zero_grad(set_to_none=True)
    return score_s, time.perf_counter() - t0


def one(kind: str, modes: str, model_dir: Path, run_dir: Path | None, rounds: int, threads: int,
        budget: int | None = None) -> dict:
    """Time one batch kind in this process: ``modes`` "both" alternates padded and packed passes
    ``rounds`` times (the same load on both) and keeps each one's best; "padded" / "packed" runs
    one pass of that mode only, for its peak resident memory."""
    import torch

    from vagent.distributed import micro_batch_rows

    torch.set_num_threads(threads)
    loaded, batch, budget, temperature = (run_batch(run_dir, model_dir, budget) if kind == "run"
                                          else ragged_batch(model_dir))
    groups = micro_batch_rows(batch, budget)
    out = {"tokens": batch.num_tokens, "rows": batch.batch_size, "micro_batches": len(groups), "budget": budget,
           "padded_positions": sum(len(g) * int(batch.lengths[g].max()) for g in groups),
           "lengths": sorted(batch.lengths.tolist()), "images": int(batch.n_images.sum())}
    if modes != "both":
        _passes(loaded.model, batch, budget, temperature, modes == "packed")
        return out | {"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    best = {mode: [float("inf"), float("inf")] for mode in (False, True)}
    for _ in range(rounds):
        for packed in (False, True):
            times = _passes(loaded.model, batch, budget, temperature, packed)
            best[packed] = [min(a, b) for a, b in zip(best[packed], times)]
    for packed, name in ((False, "padded"), (True, "packed")):
        out[name] = {"score_tok_s": batch.num_tokens / best[packed][0], "update_tok_s": batch.num_tokens / best[packed][1]}
    return out


def _child(kind: str, modes: str, model_dir: Path, run_dir: Path | None, args) -> dict:
    cmd = [sys.executable, __file__, "--one", kind, modes, str(model_dir), str(run_dir or ""),
           "--rounds", str(args.rounds), "--threads", str(args.threads), "--budget", str(args.budget or 0)]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def scaled_run(out: Path) -> Path:
    """Make the scaled-down default run (module docstring) under ``out``; its run directory."""
    cmd = [sys.executable, "-m", "vagent.cli", "train", *SCALED_RUN, f"out_dir={out}", "name=bench-packing",
           f"model.cache_dir={out / 'cache'}"]
    print(f"making a scaled default run: {' '.join(cmd[3:])}", flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, cwd=out)
    return next(out.glob("bench-packing*/"))


def tiny_model(run_dir: Path | None, out: Path) -> Path:
    """The tiny VLM of the run's ``model.tiny_*`` settings (random weights), or the default run's."""
    import yaml

    from vagent.models.tiny import build_tiny_vlm

    m = {"path": "tiny", "tiny_family": "qwen3_vl", "tiny_hidden": 128, "tiny_layers": 3, "tiny_heads": 4,
         "tiny_image_size": 128, "tiny_rope_theta": 100.0}
    if run_dir is not None:
        m |= yaml.safe_load((run_dir / "config.yaml").read_text())["model"]
    if m["path"] != "tiny":
        raise SystemExit(f"{run_dir}: model.path is {m['path']!r}; this bench rebuilds the run's model from "
                         "model.tiny_* and measures runs of the tiny model only")
    return build_tiny_vlm(out / "tiny", family=m["tiny_family"], hidden=m["tiny_hidden"], layers=m["tiny_layers"],
                          heads=m["tiny_heads"], image_size=m["tiny_image_size"], rope_theta=m["tiny_rope_theta"],
                          seed=0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", type=Path, help="run directory whose token dumps give the real batch "
                                             "(default: make a scaled-down default run first)")
    ap.add_argument("--budget", type=int, help="micro_batch_tokens of the run's batch (default: the run's own)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--one", nargs=4, metavar=("KIND", "MODES", "MODEL_DIR", "RUN_DIR"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        kind, modes, model_dir, run_dir = args.one
        print(json.dumps(one(kind, modes, Path(model_dir), Path(run_dir) if run_dir else None, args.rounds,
                             args.threads, args.budget or None)))
        return
    tmp = Path(tempfile.mkdtemp(prefix="bench-packing-"))
    run_dir = args.run.resolve() if args.run else scaled_run(tmp)
    print(f"machine: {cpu_name()} ({platform.machine()}), {args.threads} threads, best of {args.rounds} alternated "
          f"rounds; run: {run_dir}")
    for kind in ("run", "ragged"):
        model_dir = tiny_model(run_dir if kind == "run" else None, tmp / kind)
        res = _child(kind, "both", model_dir, run_dir, args)
        load = os.getloadavg()
        rss = {mode: _child(kind, mode, model_dir, run_dir, args)["peak_rss_mb"] for mode in ("padded", "packed")}
        a, b = res["padded"], res["packed"]
        print(f"{kind}: {res['rows']} rows of {res['lengths'][0]}-{res['lengths'][-1]} tokens, {res['images']} images, "
              f"{res['tokens']} tokens ({res['padded_positions']} padded positions), "
              f"{res['micro_batches']} micro-batches of <= {res['budget']}; load average {load[0]:.2f}")
        for key, label in (("update_tok_s", "update tokens/s"), ("score_tok_s", "scoring tokens/s")):
            print(f"  {label:17s} padded {a[key]:9.0f}   packed {b[key]:9.0f}   packed/padded {b[key] / a[key]:.2f}x")
        print(f"  peak RSS MB       padded {rss['padded']:9.0f}   packed {rss['packed']:9.0f}")


if __name__ == "__main__":
    main()
