"""SFT step time with and without ``sft.shared_prefix`` on the default run's demonstrations.

    python bench/sft_step.py [--model MODEL_DIR] [--demos 128] [--steps 10] [--repeats 3] [--threads 2]
                             [--micro-batch-tokens 1024 4096 ...]

Plays ``--demos`` solver demonstrations in the default run's env and SFT settings (FrozenLake,
128 px images, grounding_worldmodeling, 2 actions a turn, half of them random, up to 4 turns),
encodes them once, then times SFT steps of 8 chats (forward, backward, AdamW with lr 0, so the
weights stay put and every variant sees the same model) over the same chats:

- ``full``: every chat through the whole backbone (``sft.shared_prefix: false``);
- ``shared``: the system prompt every chat starts with run once a step without a graph, each chat
  from there (``sft.shared_prefix: true``).

With ``--micro-batch-tokens`` both variants run at each given micro-batch size (the token budget
of one forward/backward; default: the run config's ``update.micro_batch_tokens``, 1024). Each
figure is the median over ``--repeats`` runs of ``--steps`` steps; the variants alternate within a
repeat, so machine load hits all alike; ratios are against ``full`` at the first size. MODEL_DIR defaults to the default run's tiny
model (built and cached on first use: ~5 minutes).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="model directory (default: the default run's tiny model)")
    ap.add_argument("--demos", type=int, default=128)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--micro-batch-tokens", type=int, nargs="+", default=None,
                    help="micro-batch token budgets to time (default: the run config's)")
    args = ap.parse_args()

    import torch

    from vagent.models import load_policy
    from vagent.recipes.tiny_cache import prepare_model
    from vagent.runconfig import load_config
    from vagent.recipes.demos import write_demos
    from vagent.recipes.sft import SFTForward, batch_rows, demo_settings, encode_chat, read_chats, sft_batch, sft_loss

    torch.set_num_threads(args.threads)
    cfg = load_config()
    model_dir = args.model or prepare_model(cfg.model, cfg.envs, say=print)
    loaded = load_policy(model_dir)
    model, enc = loaded.model, loaded.encoder
    s = cfg.sft
    with tempfile.TemporaryDirectory() as tmp:
        write_demos(demo_settings(cfg, cfg.envs[0], args.demos), Path(tmp) / "demos.jsonl")
        convs = [encode_chat(c, enc) for c in read_chats(Path(tmp) / "demos.jsonl")]
    n_tokens = sum(sum(len(x.input_ids) for x in c.segments) for c in convs)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.0)
    model.train()
    device = torch.device("cpu")

    micros = args.micro_batch_tokens or [cfg.update.micro_batch_tokens]
    variants = [(micro, shared) for micro in micros for shared in (False, True)]

    def run(micro: int, shared: bool, first_step: int) -> float:
        t0 = time.perf_counter()
        for step in range(first_step, first_step + args.steps):
            rows, _ = batch_rows(len(convs), s.batch_size, step, 0)
            batch = sft_batch([convs[r] for r in rows], enc.pad_token_id)
            opt.zero_grad(set_to_none=True)
            sft_loss(model, batch, SFTForward(micro, cfg.update.logprob_chunk, False, device, shared))
            opt.step()
        return (time.perf_counter() - t0) / args.steps

    for micro, shared in variants:  # warm-up
        run(micro, shared, 0)
    times: dict[tuple[int, bool], list[float]] = {v: [] for v in variants}
    for r in range(args.repeats):
        for micro, shared in variants:
            times[(micro, shared)].append(run(micro, shared, args.steps * (r + 1)))
    medians = {v: statistics.median(t) for v, t in times.items()}
    base = medians[variants[0]]
    print(f"torch threads {torch.get_num_threads()}; {len(convs)} chats, {n_tokens / len(convs):.0f} tokens a chat "
          f"(system prompt {len(convs[0].segments[0].input_ids)}); {s.batch_size} chats a step")
    for (micro, shared), med in medians.items():
        name = "shared" if shared else "full"
        print(f"{name:6}  micro-batches <= {micro:5d} tokens  median {med:.3f} s a step  "
              f"({base / med:.2f}x full at {micros[0]})  runs {[round(x, 3) for x in times[(micro, shared)]]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
