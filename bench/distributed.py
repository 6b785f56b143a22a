"""Update throughput with 1 vs 2 processes at the same global batch (CPU, gloo), and on GPUs.

    python bench/distributed.py [--steps 4] [--envs 8] [--repeats 1]          # CPU: 1 vs 2 processes
    torchrun --nproc_per_node G bench/distributed.py --gpu [--rows 16 --length 1024] [--model DIR]

CPU: the same PPO run (tiny VLM h128 x 2 layers, separate critic, greedy rollouts so every
variant updates on the same episodes) as ``vagent train`` in three shapes on the same two cores:
1 process x 1 thread, 1 process x 2 threads, 2 processes (torchrun, FSDP2, gloo) x 1 thread. The
figure is ``perf/update_tokens_per_s`` of ``metrics.jsonl`` (rank 0's clock around the scoring
passes and the actor + critic update, collectives included), the median over steps 1.. (step 0
warms up). Same global batch: every variant's ``rollout/batch_tokens`` is printed and must agree.

GPU (``--gpu``, each rank on its own card; never run in CI): a Qwen2.5-VL-3B-shaped model with
random weights built from its sizes (``vagent.models.tiny.build_tiny_vlm`` with the 3B's language
model: hidden 2048, 36 layers, 16 heads, 2 KV heads, MLP 11008, vocab 151936; vision tower 1280 x
32 layers, with 80 heads of 16 instead of the 3B's 16 of 80: the same parameter count), fp32
master weights, bf16 autocast, FSDP2 with bf16 parameters and fp32 gradient reduction when G > 1.
It times ``actor_update`` (vagent's PPO update: forward, backward, AdamW) on a synthetic batch of
``--rows`` x ``--length`` tokens, without and with activation checkpointing, and prints update
tokens/s (over all ranks), MFU = 6 x parameters x tokens / (seconds x G x the card's bf16 dense
peak), and peak memory per card.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: bf16 dense peak FLOP/s of cards we may meet (the vendors' data sheets, without sparsity)
BF16_PEAK = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "L40S": 362e12, "A10": 125e12}


def cpu(args: argparse.Namespace) -> None:
    from vagent.models.tiny import build_tiny_vlm

    tmp = Path(tempfile.mkdtemp(prefix="bench-distributed-"))
    model = build_tiny_vlm(tmp / "tiny", hidden=128, layers=2, image_size=96)
    common = [f"steps={args.steps}", "sft.steps=0", "val.every=0", f"envs.0.n_train={args.envs}", "envs.0.n_val=0",
              "rollout.max_turns=3", "rollout.max_new_tokens=24", "rollout.temperature=0", "update.kl_coef=0",
              "ppo.critic_backbone=separate", "update.micro_batch_tokens=2048", f"model.path={model}",
              "model.cache_dir=UNUSED", "log.tensorboard=false", "log.progress=false", "log.rollouts_every=0",
              "log.checkpoint_every=0", "log.plot_every=0"]
    shapes = {"1 process x 1 thread": (None, 1), "1 process x 2 threads": (None, 2),
              "2 processes x 1 thread": (2, 1)}
    results: dict[str, list[float]] = {k: [] for k in shapes}
    tokens: dict[str, float] = {}
    for rep in range(args.repeats):
        for name, (nproc, threads) in shapes.items():
            out = tmp / f"runs-{rep}-{nproc}-{threads}"
            cmd = [sys.executable, "-m", "vagent", "train", *(["--nproc", str(nproc)] if nproc else []),
                   *common, f"threads={threads}", f"out_dir={out}", "--quiet"]
            subprocess.run(cmd, check=True, cwd=tmp, env=dict(os.environ, OMP_NUM_THREADS=str(threads)))
            (run,) = list(out.iterdir())
            recs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
            rl = [r for r in recs if r.get("phase") == "rl" and "perf/update_tokens_per_s" in r]
            results[name].append(statistics.median(r["perf/update_tokens_per_s"] for r in rl[1:]))
            tokens[name] = statistics.mean(r["rollout/batch_tokens"] for r in rl)
    base = statistics.median(results["1 process x 1 thread"])
    print(f"\nupdate tokens/s, PPO with a separate critic, {args.envs} envs x {args.steps} steps, "
          f"median of steps 1..{args.steps - 1} ({args.repeats} repeat(s)), {os.cpu_count()} CPUs:")
    for name, vals in results.items():
        v = statistics.median(vals)
        print(f"  {name:24s} {v:9.0f} tokens/s  ({v / base:.2f}x)   batch tokens/step {tokens[name]:.0f}")


def gpu(args: argparse.Namespace) -> None:
    import torch

    from vagent.distributed import init_world, shard_model, shutdown_world, world
    from vagent.models.loading import count_parameters, load_policy
    from vagent.models.tiny import build_tiny_vlm
    from vagent.runconfig import UpdateConfig
    from vagent.recipes.scoring import policy_forward
    from vagent.recipes.stages import Advantages, OffPolicy, Scores
    from vagent.recipes.update import Learner, UpdateContext, actor_update
    from vagent.rollout.batch import TokenBatch

    init_world("cuda", timeout_s=1800)
    w = world()
    device = torch.device("cuda", torch.cuda.current_device())
    model_dir = Path(args.model or Path(tempfile.gettempdir()) / "vagent-qwen2_5_vl-3b-shaped")
    if w.is_main and not (model_dir / "config.json").is_file():
        build_tiny_vlm(model_dir, hidden=2048, layers=36, heads=16, kv_heads=2, intermediate=11008,
                       vision_hidden=1280, vision_layers=32, vocab_size=151936, image_size=448)
    if w.distributed:
        from vagent.distributed import barrier

        barrier("3B-shaped model built")
    card = torch.cuda.get_device_name(device)
    peak = next((v for k, v in BF16_PEAK.items() if k in card), None)
    B, L = args.rows, args.length
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(10, 4000, (B, L), generator=g)
    # --ragged: row lengths uniform in [L/8, L] (right-padded), as a multi-turn batch is; else all L
    lengths = (torch.randint(L // 8, L + 1, (B,), generator=g) if args.ragged else torch.full((B,), L))
    real = torch.arange(L)[None, :] < lengths[:, None]
    ids = torch.where(real, ids, torch.zeros_like(ids))
    loss = real & (torch.arange(L)[None, :] >= (lengths // 2)[:, None])  # the second half of every row is "sampled"
    n_tokens = int(lengths.sum())
    f32 = torch.zeros(B, L)
    batch = TokenBatch(
        input_ids=ids, attention_mask=real.long(), loss_mask=loss, old_logprobs=f32,
        turn_end_mask=torch.zeros(B, L, dtype=torch.bool), token_rewards=f32.clone(),
        turn_index=torch.full((B, L), -1), bootstrap_index=torch.full((B,), -1), truncated=torch.zeros(B, dtype=torch.bool),
        episode_returns=torch.zeros(B), group_ids=torch.arange(B), traj_ids=torch.arange(B), row_turn=torch.full((B,), -1),
        pixel_values=None, image_grid_thw=None, state_keys=[[] for _ in range(B)],
        n_images=torch.zeros(B, dtype=torch.long), episode_index=torch.arange(B),
    ).to(device)
    # the runs: (activation checkpointing, packing): without / with checkpointing, or with --ragged
    # padded / packed (update.packing) without checkpointing
    runs = [(False, False), (False, True)] if args.ragged else [(False, False), (True, False)]
    for ckpt, packing in runs:
        u = UpdateConfig(micro_batch_tokens=args.micro_batch_tokens, epochs=1, mini_batches=1, actor_lr=1e-6,
                         packing=packing)
        loaded = load_policy(model_dir, dtype="float32", device=device, gradient_checkpointing=ckpt)
        model = shard_model(loaded.model, bf16=True)
        n_params = count_parameters(loaded.model)
        params = [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=1e-6)
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            # one row at a time (a row's forward is trimmed to its length): padded back to L
            old = torch.cat([pad_to(policy_forward(model, batch.select([r]), 1024)[0], L) for r in range(B)])
        adv = torch.randn(B, L, generator=g).to(device) * loss.to(device)
        ctx = UpdateContext(device, True, 0, 0, None)
        records = (Scores(old_logprobs=old, ref_logprobs=None), Advantages(advantages=adv, kl_ref=None),
                   OffPolicy(anchor=old, is_weights=None, loss_mask=batch.loss_mask, metrics={}))
        times = []
        torch.cuda.reset_peak_memory_stats(device)
        for i in range(args.steps + 1):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            actor_update(Learner(model, params, opt), batch, *records, u, ctx)
            torch.cuda.synchronize()
            if i > 0:  # the first step warms up
                times.append(time.perf_counter() - t0)
        if args.profile and w.is_main:
            profile_step(lambda: actor_update(Learner(model, params, opt), batch, *records, u, ctx),
                         f"packing {'on' if packing else 'off'}, checkpointing {'on' if ckpt else 'off'}")
        t = statistics.median(times)
        tokens_per_s = n_tokens / t  # real (non-pad) tokens of the global batch: every rank's share together
        mfu = 6 * n_params * n_tokens / (t * w.size * peak) if peak else float("nan")
        mem = torch.cuda.max_memory_allocated(device) / 2**30
        if w.is_main:
            shape = f"batch {B} x {L}" + (f" ragged ({n_tokens} real tokens), packing {'on' if packing else 'off'}"
                                          if args.ragged else "")
            print(f"{card} x {w.size}, {n_params / 1e9:.2f}B params, {shape}, activation checkpointing "
                  f"{'on ' if ckpt else 'off'}: update {tokens_per_s:,.0f} tokens/s, MFU {mfu:.1%}, "
                  f"peak memory {mem:.1f} GiB per card (median of {args.steps} steps)", flush=True)
        del model, loaded, opt, params
        torch.cuda.empty_cache()
    shutdown_world()


def profile_step(step, title: str) -> None:
    """One more update step under torch.profiler: the ops with the most device time and the most
    host (CPU) time, so that a slow path shows where its time goes."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    table = prof.key_averages()
    print(f"== profile ({title}): by device time", flush=True)
    print(table.table(sort_by="self_device_time_total", row_limit=12, max_name_column_width=60), flush=True)
    print(f"== profile ({title}): by host time", flush=True)
    print(table.table(sort_by="self_cpu_time_total", row_limit=12, max_name_column_width=60), flush=True)


def pad_to(logprobs, length: int):
    """``[1, n]`` log-probs right-padded with zeros to ``[1, length]``."""
    import torch.nn.functional as F

    return F.pad(logprobs, (0, length - logprobs.shape[-1]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", action="store_true", help="the GPU measurement (run under torchrun, one rank per card)")
    ap.add_argument("--steps", type=int, default=4, help="CPU: PPO steps per run; GPU: timed update steps")
    ap.add_argument("--envs", type=int, default=8, help="CPU: envs per step (the global batch)")
    ap.add_argument("--repeats", type=int, default=1, help="CPU: runs of each shape (medians)")
    ap.add_argument("--rows", type=int, default=16, help="GPU: rows of the synthetic batch")
    ap.add_argument("--length", type=int, default=1024, help="GPU: tokens per row")
    ap.add_argument("--micro-batch-tokens", type=int, default=8192, help="GPU: update.micro_batch_tokens")
    ap.add_argument("--model", default=None, help="GPU: where the 3B-shaped model is built / reused")
    ap.add_argument("--ragged", action="store_true",
                    help="GPU: rows of L/8..L tokens, timed padded and packed (update.packing) instead of "
                         "without / with activation checkpointing")
    ap.add_argument("--profile", action="store_true", help="GPU: profile one more update step of each run")
    args = ap.parse_args()
    gpu(args) if args.gpu else cpu(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
