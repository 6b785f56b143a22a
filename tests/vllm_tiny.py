"""A tiny VLM that vLLM's CPU build can serve and whose greedy replies depend on the image.

The tiny builder's default shape (hidden 128, 4 heads: head size 32) is one vLLM's CPU attention
serves; its default random init answers every prompt with one repeated token, which would let a
wrong weight push or a stale image cache pass unnoticed. Re-drawing every matrix from N(0, 0.2^2)
gives replies that differ by image and by turn (measured: 4 boards, 2 turns, no two replies equal
after the third token)."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch


def build_vllm_tiny(out_dir: Path, image_size: int = 64, std: float = 0.2, seed: int = 0) -> Path:
    """Build the tiny Qwen2.5-VL in ``out_dir`` with its matrices re-drawn (module docstring)."""
    from vagent.models.loading import load_policy
    from vagent.models.tiny import build_tiny_vlm

    base = build_tiny_vlm(Path(str(out_dir) + "-base"), hidden=128, layers=2, image_size=image_size, seed=seed)
    loaded = load_policy(base)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in loaded.model.parameters():
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=g) * std)
    shutil.copytree(base, out_dir)  # tokenizer, processor, chat template, config
    loaded.model.save_pretrained(out_dir)
    return Path(out_dir)


def docs_train_command() -> list[str]:
    """The ``vagent train`` line of docs/models.md's vLLM section ("Running it"), as written (its
    words before the comment)."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "models.md").read_text()
    section = text[text.index("**Running it.**"):]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    (line,) = [x for x in block.splitlines() if " train " in x]
    return line.split("#", 1)[0].split()
