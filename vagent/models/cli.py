"""``vagent model ...``: build a tiny test model, describe a model directory.

    vagent model init-tiny OUT_DIR [--family qwen2_5_vl] [--hidden 128] [--layers 2] [--heads 4]
                                   [--vocab-size 4096] [--image-size 96] [--seed 0]
    vagent model info DIR_OR_HUB_ID [--gguf-file F] [--min-pixels N] [--max-pixels N] [--trust-remote-code]

``--family qwen2`` or ``llama`` builds a text-only causal LM instead of a VLM.
``vagent/cli.py`` calls ``add_parser`` (which sets ``func=run``); heavy imports happen inside
the commands so ``vagent --help`` stays fast.
"""

from __future__ import annotations

import argparse
import sys
import time

from vagent.models.tiny import LM_FAMILIES, VLM_FAMILIES


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``model`` command (with ``init-tiny`` and ``info``) to an argparse subparsers object."""
    parser = subparsers.add_parser("model", help="build a tiny test model, describe a model directory")
    sub = parser.add_subparsers(dest="model_command", required=True)
    init = sub.add_parser("init-tiny", help="write a tiny random-weight model that loads like a real checkpoint")
    init.add_argument("out_dir")
    init.add_argument("--family", default="qwen2_5_vl", choices=VLM_FAMILIES + LM_FAMILIES,
                      help="VLM family, or qwen2/llama for a text-only LM (default qwen2_5_vl)")
    init.add_argument("--hidden", type=int, default=128, help="language model hidden size")
    init.add_argument("--layers", type=int, default=2, help="language model layers")
    init.add_argument("--heads", type=int, default=4, help="attention heads")
    init.add_argument("--kv-heads", type=int, default=2, help="key/value heads")
    init.add_argument("--vision-hidden", type=int, default=64, help="vision encoder width")
    init.add_argument("--vision-layers", type=int, default=2, help="vision encoder depth")
    init.add_argument("--vocab-size", type=int, default=4096, help="embedding rows / tokenizer size limit")
    init.add_argument("--image-size", type=int, default=96, help="image side giving 9 image tokens (max_pixels = side^2)")
    init.add_argument("--seed", type=int, default=0, help="weight-init seed")
    init.add_argument("--rope-theta", type=float, default=None,
                      help="language model rotary base of a VLM (default: the family's, 1e6 / 5e6)")
    info = sub.add_parser("info", help="print parameter count, vision support, image token counts")
    info.add_argument("model_dir", help="model directory or Hugging Face Hub id (OWNER/NAME: the HF cache)")
    info.add_argument("--gguf-file", default=None, help="GGUF file inside model_dir (text-only models)")
    info.add_argument("--min-pixels", type=int, default=None, help="image resize range, smallest area (model.min_pixels)")
    info.add_argument("--max-pixels", type=int, default=None, help="image resize range, largest area (model.max_pixels)")
    info.add_argument("--trust-remote-code", action="store_true", help="run the checkpoint's own code")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    """Execute a parsed ``model`` command; returns the exit code."""
    if args.model_command == "init-tiny":
        return _init_tiny(args)
    if args.model_command == "info":
        return _info(args)
    raise ValueError(f"unknown model command {args.model_command!r}")


def _init_tiny(args) -> int:
    from vagent.models.tiny import build_tiny_lm, build_tiny_vlm

    start = time.perf_counter()
    common = dict(hidden=args.hidden, layers=args.layers, heads=args.heads, kv_heads=args.kv_heads,
                  vocab_size=args.vocab_size, seed=args.seed)
    if args.family in LM_FAMILIES:
        out = build_tiny_lm(args.out_dir, family=args.family, **common)
    else:
        out = build_tiny_vlm(args.out_dir, family=args.family, vision_hidden=args.vision_hidden,
                             vision_layers=args.vision_layers, image_size=args.image_size,
                             rope_theta=args.rope_theta, **common)
    print(f"wrote tiny {args.family} model to {out} in {time.perf_counter() - start:.1f}s")
    return 0


def _info(args) -> int:
    from vagent.models.loading import count_parameters, load_policy

    try:
        loaded = load_policy(args.model_dir, gguf_file=args.gguf_file, min_pixels=args.min_pixels,
                             max_pixels=args.max_pixels, trust_remote_code=args.trust_remote_code)
    except (FileNotFoundError, NotADirectoryError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    enc = loaded.encoder
    config = loaded.model.config
    print(f"model:        {loaded.name}")
    print(f"class:        {type(loaded.model).__name__} ({config.model_type})")
    print(f"parameters:   {count_parameters(loaded.model):,}")
    print(f"dtype:        {next(loaded.model.parameters()).dtype}")
    print(f"vocab:        tokenizer {len(enc.tokenizer)}, embeddings {config.get_text_config().vocab_size}")
    print(f"eos ids:      {enc.eos_token_ids}  pad id: {enc.pad_token_id}")
    print(f"chat template: {enc.chat_template_source}")
    print(f"vision:       {loaded.is_vision}")
    if loaded.is_vision:
        print(f"resize:       {enc.min_pixels} <= pixels <= {enc.max_pixels} "
              f"(merge size {enc.merge_size})")
        for side in (96, 224, 448):
            print(f"image tokens: {side}x{side} -> {enc.image_token_count(side, side)}")
    return 0
