"""What a (tiny) VLM reads off FrozenLake boards it never saw: greedy captions scored exactly.

    python bench/perception.py MODEL_DIR [--n 64] [--relations] [--image-size 128] [--threads 2]

MODEL_DIR is any model directory, e.g. the default run's cached tiny model
(``~/.cache/vagent/tiny-qwen3_vl-...-cap700-...``). Boards come from the ``val`` split, so none
was used by caption pretraining (train split). The prompt is the caption-pretraining one (the
env's own observation text and image, no system prompt); the model continues greedily and we
report:

- ``grid exact``: the ``<observation>`` grid equals the true symbolic grid, every cell;
- ``cell accuracy``: share of the 16 cells right;
- ``relation exact`` (with ``--relations``): the sentence after ``<reasoning>`` equals the true
  "The goal is ... of you." sentence, and the confusion of (true, predicted) relations.

This is a measurement of a model, not a speed benchmark: the figures are shares of ``--n`` boards.
"""

from __future__ import annotations

import collections
import tempfile
from pathlib import Path

from common import policy_probe_parser


def main() -> int:
    ap = policy_probe_parser(__doc__, n=64, dir_arg="model_dir")
    ap.add_argument("--relations", action="store_true", help="also score the goal-relation sentence")
    ap.add_argument("--image-size", type=int, default=128)
    args = ap.parse_args()

    import torch
    from PIL import Image

    import vagent.seeds as seeds
    from vagent.models.loading import load_policy
    from vagent.runconfig import EnvEntry
    from vagent.recipes.pretrain import caption_records
    from vagent.rollout.hf_policy import HFPolicy
    from vagent.rollout.policy import Conversation, Message, SamplingConfig

    torch.set_num_threads(args.threads)
    entry = EnvEntry("frozenlake", {"format": "grounding_worldmodeling", "render": "vision",
                                    "image_size": args.image_size, "description_style": "symbolic"})
    work = Path(tempfile.mkdtemp(prefix="vagent_perception_"))
    (work / "images").mkdir()
    train_split = seeds.split_seeds
    seeds.split_seeds = lambda split, n, offset=0: train_split("val", n)  # held-out boards
    try:
        recs = caption_records([entry], args.n, seed=7, image_dir=work / "images",
                               relations=("goal",) if args.relations else ())
    finally:
        seeds.split_seeds = train_split
    policy = HFPolicy(load_policy(args.model_dir))
    convs = [Conversation(messages=[Message("user", r["messages"][0]["content"],
                                            (Image.open(work / r["images"][0]).convert("RGB"),))]) for r in recs]
    stop = ("</reasoning>",) if args.relations else ("</observation>",)
    replies = policy.act(convs, SamplingConfig(temperature=0, max_new_tokens=96, stop=stop, seed=0))

    grid_ok, cells, rel_ok, confusion = 0, 0.0, 0, collections.Counter()
    for r, rep in zip(recs, replies):
        target = r["messages"][1]["content"]
        true_grid = target.split("<observation>")[1].split("</observation>")[0]
        got = rep.text.split("<observation>")[1].split("</observation>")[0] if "<observation>" in rep.text else ""
        grid_ok += got == true_grid
        a, b = got.replace("\n", ""), true_grid.replace("\n", "")
        cells += sum(x == y for x, y in zip(a, b)) / len(b) if len(a) == len(b) else 0.0
        if args.relations:
            true_rel = target.split("<reasoning>")[1]
            got_rel = rep.text.split("<reasoning>")[1][:len(true_rel)] if "<reasoning>" in rep.text else "?"
            rel_ok += got_rel == true_rel
            confusion[(true_rel[12:-8], got_rel[12:-8])] += 1
    n = len(recs)
    print(f"model: {args.model_dir}")
    print(f"{n} held-out boards: grid exact {grid_ok / n:.3f}, cell accuracy {cells / n:.3f}"
          + (f", relation exact {rel_ok / n:.3f}" if args.relations else ""))
    for (t, g), k in confusion.most_common(8):
        print(f"  {k:3d}  true: {t!r:32}  said: {g!r}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
