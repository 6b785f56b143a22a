"""Tiny random-weight models that load exactly like real checkpoints, for CPU tests and smoke runs.

``build_tiny_vlm`` writes a directory with the same files a Qwen2.5-VL (or Qwen2-VL / Qwen3-VL)
checkpoint has -- ``config.json``, ``model.safetensors``, ``generation_config.json``,
``tokenizer.json`` + ``tokenizer_config.json`` + ``chat_template.jinja`` and
``preprocessor_config.json`` -- so ``load_policy(out_dir)`` goes through the ordinary
``from_pretrained`` path. ``build_tiny_lm`` does the same for a text-only causal LM (Qwen2 or
Llama architecture) sharing the tokenizer.

The tokenizer (a byte-level BPE trained offline on a built-in corpus; the reasoning tags one token
each) and the chat template are :mod:`vagent.models.tiny_tokenizer`, re-exported here.

Determinism: weights come from ``torch.manual_seed(seed)`` inside a forked RNG (the caller's
global RNG is untouched); the same arguments (and the same set of registered envs) give
byte-identical files.

Sizes measured on 2 CPU cores (docs/algorithms.md reference section 12): hidden 128 / 2 layers is ~1.3M params
(tied embeddings), a 96 x 96 image gives 9 image tokens.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

from vagent.models.tiny_tokenizer import (  # noqa: F401 -- the tokenizer's names stay importable from here
    CHAT_TEMPLATE, REASONING_TAGS, SPECIAL_TOKENS, TOKENIZER_ENVS, build_tokenizer, tokenizer_corpus,
)

VLM_FAMILIES = ("qwen2_5_vl", "qwen2_vl", "qwen3_vl")
LM_FAMILIES = ("qwen2", "llama")


def mrope_sections(head_dim: int, family: str) -> list[int]:
    """Split ``head_dim / 2`` rotary frequencies into (temporal, height, width) sections.

    Qwen2/2.5-VL use [16, 24, 24] for head_dim 128 (ratio 2:3:3); Qwen3-VL [24, 20, 20].
    """
    half = head_dim // 2
    if head_dim % 2 or half < 3:
        raise ValueError(f"head_dim={head_dim} must be even and >= 6 for mRoPE")
    t = (3 * half) // 8 if family == "qwen3_vl" else half // 4
    h = (half - t) // 2
    sections = [t, h, half - t - h]
    assert sum(sections) == half
    return sections


def _text_dims(hidden: int, heads: int, kv_heads: int, intermediate: int | None) -> tuple[int, int]:
    if hidden % heads:
        raise ValueError(f"hidden={hidden} must be divisible by heads={heads}")
    if heads % kv_heads:
        raise ValueError(f"heads={heads} must be divisible by kv_heads={kv_heads}")
    return hidden // heads, intermediate or 4 * hidden


#: the language model's rotary base per VLM family (the real checkpoints' values)
FAMILY_ROPE_THETA = {"qwen2_5_vl": 1e6, "qwen2_vl": 1e6, "qwen3_vl": 5e6}


def _vlm_config(family, tok, hidden, layers, heads, kv_heads, intermediate, vision_hidden,
                vision_layers, vocab_size, rope_theta=None):
    head_dim, intermediate = _text_dims(hidden, heads, kv_heads, intermediate)
    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    vision_heads = max(1, vision_hidden // 16)
    text = dict(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=intermediate,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        max_position_embeddings=32768, bos_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"],
        tie_word_embeddings=True,
    )
    top = dict(
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True,
    )
    if family not in FAMILY_ROPE_THETA:
        raise ValueError(f"unknown VLM family {family!r}; choose one of {VLM_FAMILIES}")
    theta = float(rope_theta) if rope_theta else FAMILY_ROPE_THETA[family]
    rope = {"rope_type": "default", "mrope_section": mrope_sections(head_dim, family), "rope_theta": theta}
    if family == "qwen2_5_vl":
        from transformers import Qwen2_5_VLConfig
        vision = dict(depth=vision_layers, hidden_size=vision_hidden, intermediate_size=2 * vision_hidden,
                      num_heads=vision_heads, out_hidden_size=hidden, patch_size=14,
                      fullatt_block_indexes=[vision_layers - 1], window_size=112)
        return Qwen2_5_VLConfig(text_config=dict(text, rope_parameters=rope),
                                vision_config=vision, **top)
    if family == "qwen2_vl":
        from transformers import Qwen2VLConfig
        vision = dict(depth=vision_layers, embed_dim=vision_hidden, hidden_size=hidden, mlp_ratio=2,
                      num_heads=vision_heads, patch_size=14)
        return Qwen2VLConfig(text_config=dict(text, rope_parameters=rope),
                             vision_config=vision, **top)
    if family == "qwen3_vl":
        from transformers import Qwen3VLConfig
        text = dict(text, head_dim=head_dim,
                    rope_parameters={**rope, "mrope_interleaved": True})
        vision = dict(depth=vision_layers, hidden_size=vision_hidden, intermediate_size=2 * vision_hidden,
                      num_heads=vision_heads, out_hidden_size=hidden, patch_size=16,
                      num_position_embeddings=144, deepstack_visual_indexes=[vision_layers // 2])
        return Qwen3VLConfig(text_config=text, vision_config=vision, **top)


def _save_common(model, tok, out: Path, seed: int) -> None:
    from transformers import GenerationConfig

    model.save_pretrained(out)
    tok.save_pretrained(out)
    eos = [tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")]
    GenerationConfig(eos_token_id=eos, pad_token_id=eos[1], bos_token_id=eos[1]).save_pretrained(out)
    (out / "vagent_tiny.json").write_text(json.dumps({"builder": "vagent.models.tiny", "seed": seed}) + "\n")


def build_tiny_vlm(
    out_dir: str | Path,
    family: str = "qwen2_5_vl",
    hidden: int = 128,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int | None = None,
    vision_hidden: int = 64,
    vision_layers: int = 2,
    vocab_size: int = 4096,
    image_size: int = 96,
    seed: int = 0,
    extra_corpus: Sequence[str] = (),
    rope_theta: float | None = None,
) -> Path:
    """Build a tiny random-weight VLM checkpoint in ``out_dir`` and return its path.

    Args:
        family: ``qwen2_5_vl`` (default), ``qwen2_vl`` or ``qwen3_vl``.
        hidden, layers, heads, kv_heads, intermediate: language model sizes
            (``intermediate`` defaults to ``4 * hidden``; head_dim = hidden / heads).
        vision_hidden, vision_layers: vision encoder sizes (heads = vision_hidden / 16).
        vocab_size: embedding rows; the tokenizer has at most this many tokens.
        image_size: the image processor's ``max_pixels`` is ``image_size**2``, so an image of
            ``image_size`` x ``image_size`` (or larger, downscaled) gives 9 merged image tokens
            at the default 96.
        seed: weight-init seed.
        extra_corpus: more tokenizer training text (e.g. your task's prompts).
        rope_theta: the language model's rotary base; None = the family's (1e6 for Qwen2/2.5-VL,
            5e6 for Qwen3-VL). Those bases are made for 32k+ contexts of 128-dim heads: with a
            tiny model's 32-dim heads over a few hundred tokens only the 2-3 fastest of its 16
            frequencies tell nearby positions apart. A small base (e.g. 100) gives every head
            fine position resolution, and a tiny model learns to read a board off the image
            tokens in fewer steps (docs/training.md).
    """
    import torch
    from transformers import AutoModelForImageTextToText
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(vocab_size, extra_corpus)
    config = _vlm_config(family, tok, hidden, layers, heads, kv_heads, intermediate, vision_hidden,
                         vision_layers, vocab_size, rope_theta)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForImageTextToText.from_config(config)
    _save_common(model, tok, out, seed)
    patch = config.vision_config.patch_size
    factor = patch * 2
    qwen3 = family == "qwen3_vl"
    mean, std = ([0.5] * 3, [0.5] * 3) if qwen3 else (None, None)
    kwargs = dict(image_mean=mean, image_std=std) if qwen3 else {}
    processor = Qwen2VLImageProcessorPil(
        min_pixels=(2 * factor) ** 2, max_pixels=max(image_size ** 2, factor ** 2),
        patch_size=patch, merge_size=2, temporal_patch_size=2, **kwargs,
    )
    processor.save_pretrained(out)
    return out


def build_tiny_lm(
    out_dir: str | Path,
    family: str = "qwen2",
    hidden: int = 128,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int | None = None,
    vocab_size: int = 4096,
    seed: int = 0,
    extra_corpus: Sequence[str] = (),
) -> Path:
    """Build a tiny random-weight text-only causal LM (``qwen2`` or ``llama``) with the same tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    if family not in LM_FAMILIES:
        raise ValueError(f"unknown LM family {family!r}; choose one of {LM_FAMILIES}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(vocab_size, extra_corpus)
    _, intermediate = _text_dims(hidden, heads, kv_heads, intermediate)
    pad = tok.convert_tokens_to_ids("<|endoftext|>")
    cls = Qwen2Config if family == "qwen2" else LlamaConfig
    config = cls(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=intermediate,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        max_position_embeddings=32768, bos_token_id=pad, pad_token_id=pad,
        eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"), tie_word_embeddings=True,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config)
    _save_common(model, tok, out, seed)
    return out


def redraw_weights(model, seed: int) -> None:
    """Re-draw ``model``'s weights in place so that greedy replies depend on the prompt's image (for
    engine parity checks: the builders' default init answers every prompt with one repeated token,
    which makes "equal replies" prove nothing). Matrices ~ N(0, 1 / fan_in) (embeddings x 4), norm
    weights 1, biases ~ N(0, 0.1); deterministic in ``seed``, the global RNG untouched."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                scale = (4.0 if "embed" in name else 1.0) / p.shape[-1] ** 0.5
                p.copy_(torch.randn(p.shape, generator=g) * scale)
            elif "norm" in name or "ln_q" in name:
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
