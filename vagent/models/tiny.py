"""Tiny random-weight models that load exactly like real checkpoints, for CPU tests and smoke runs.

``build_tiny_vlm`` writes a directory with the same files a Qwen2.5-VL (or Qwen2-VL / Qwen3-VL)
checkpoint has -- ``config.json``, ``model.safetensors``, ``generation_config.json``,
``tokenizer.json`` + ``tokenizer_config.json`` + ``chat_template.jinja`` and
``preprocessor_config.json`` -- so ``load_policy(out_dir)`` goes through the ordinary
``from_pretrained`` path. ``build_tiny_lm`` does the same for a text-only causal LM (Qwen2 or
Llama architecture) sharing the tokenizer.

The tokenizer is a byte-level BPE (the Qwen2 pre-tokenizer: NFC, the Qwen split regex, byte
level) trained offline with ``tokenizers`` on a built-in corpus of chat role words, reasoning
tags, action and direction words, env vocabulary, the system prompts of every registered env
(when ``vagent.envs`` is importable) and ``extra_corpus``. Token ids:

- 0..6: ``<|endoftext|> <|im_start|> <|im_end|> <|vision_start|> <|vision_end|> <|image_pad|>
  <|video_pad|>`` (special tokens; the config's ``image_token_id`` etc. point at them);
- then the byte alphabet and the learned merges;
- last: the reasoning tags ``<think> </think> ... <answer> </answer> <tool_call> </tool_call>`` as
  added (non-special) tokens, so each tag is ONE token and survives ``skip_special_tokens``.

Determinism: weights come from ``torch.manual_seed(seed)`` inside a forked RNG (the caller's
global RNG is untouched); the same arguments (and the same set of registered envs) give
byte-identical files.

Sizes measured on 2 CPU cores (docs/algorithms.md reference section 12): hidden 128 / 2 layers is ~1.3M params
(tied embeddings), a 96 x 96 image gives 9 image tokens.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Iterable, Sequence

logger = logging.getLogger(__name__)

SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
REASONING_TAGS = (
    "<think>", "</think>", "<observation>", "</observation>", "<reasoning>", "</reasoning>",
    "<prediction>", "</prediction>", "<answer>", "</answer>", "<tool_call>", "</tool_call>",
)
VLM_FAMILIES = ("qwen2_5_vl", "qwen2_vl", "qwen3_vl")
LM_FAMILIES = ("qwen2", "llama")

# The Qwen2-VL chat template (images as {"type": "image"} content parts, the default system
# prompt when the first message is not a system message), minus video support.
CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}"
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}"
    "{% endfor %}<|im_end|>\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Qwen2's pre-tokenizer split (transformers/models/qwen2/tokenization_qwen2.py).
_QWEN_SPLIT_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

_ACTIONS = "up down left right forward backward turn look pick place push move stop rotate".split()
_DIRECTIONS = "above below same left right ahead behind back front near far".split()
_OBJECTS = (
    "player box target wall floor hole goal frozen lake ice start cube apple drawer robot arm "
    "gripper table object chair sofa door window lamp bed fridge mug bowl plate"
).split()
_ENV_WORDS = (
    "Sokoban FrozenLake Navigation PrimitiveSkill SVG grid room map cell row column step turn "
    "reward success failure episode action actions valid invalid format image images "
    "observation state position coordinate coordinates distance meters degrees mm x y z "
    "separate separated comma answer think reasoning prediction example instruction task "
    "rules symbol symbols legend push boxes onto targets avoid holes reach"
).split()
_ENGLISH = (
    "You are a helpful assistant. You are an agent playing a game. The game shows you an "
    "image of the current state. Your goal is to solve the puzzle in as few steps as possible. "
    "Think step by step about what you see, then give your answer. Describe the position of "
    "each object relative to you. What will happen after your action? The answer must contain "
    "at most three actions. If an action is not valid the turn ends. You can move in four "
    "directions. There is a wall in front of the player. The box is on the target. The goal is "
    "two cells below and one cell to the right. I should move down first, then right. After "
    "moving, the player will be next to the box. This is the first turn. This is the last turn. "
    "Please respond in the required format. Your previous answer was invalid. Well done, the "
    "task is complete. Where is the red cube? Pick up the cube and place it on the green one. "
    "The user asks a question about the picture and the assistant answers it."
)


# The envs whose system prompts train the tiny tokenizer. A fixed list (not ``list_envs()``) so
# that registering a new env does not change the tokenizer, and with it every tiny model and
# every measured result; other envs' words are still covered by the byte-level BPE.
TOKENIZER_ENVS = ("frozenlake", "sokoban", "vigorl_search", "vigorl_zoom")


def _env_system_prompts() -> list[str]:
    """System prompts of the ``TOKENIZER_ENVS``, when ``vagent.envs`` exists (else none)."""
    try:
        import vagent.envs as envs
    except ImportError:
        logger.info("vagent.envs not importable: tokenizer corpus has no env system prompts")
        return []
    if not (hasattr(envs, "list_envs") and hasattr(envs, "make")):
        return []
    prompts = []
    for name in TOKENIZER_ENVS:
        try:
            env = envs.make(name)
        except ImportError as exc:  # an env whose optional dependency is missing
            logger.info("env %s skipped in tokenizer corpus: %s", name, exc)
            continue
        try:
            prompts.append(env.system_prompt())
        finally:
            env.close()
    return prompts


def tokenizer_corpus(extra_corpus: Iterable[str] = ()) -> list[str]:
    """The deterministic training text of the tiny tokenizer (see the module docstring)."""
    from vagent.models._corpus import SUFFIXES, WORDS

    words = WORDS.split()
    corpus = [_ENGLISH, " ".join(words), " ".join(w.capitalize() for w in words)]
    corpus += [" ".join(w + suffix for w in words) for suffix in SUFFIXES]
    for i, role in enumerate(("system", "user", "assistant") * 4):
        corpus.append(f"<|im_start|>{role}\n{' '.join(words[i * 40:(i + 1) * 40])}<|im_end|>\n")
    corpus += [" ".join(words) for words in (_ACTIONS, _DIRECTIONS, _OBJECTS, _ENV_WORDS)]
    for obj in _OBJECTS:
        for vert in ("above", "below", "same row"):
            for hor in ("left", "right", "same column"):
                corpus.append(f"The {obj} is {vert} and {hor} of the player.")
    tags = " ".join(REASONING_TAGS)
    for i, act in enumerate(_ACTIONS):
        other = _ACTIONS[(i + 3) % len(_ACTIONS)]
        corpus.append(
            f"<think><observation>The {_OBJECTS[i]} is {_DIRECTIONS[i % 6]} me.</observation>"
            f"<reasoning>I should go {act}.</reasoning><prediction>The {_OBJECTS[i]} will be "
            f"{_DIRECTIONS[(i + 1) % 6]} me.</prediction></think><answer>{act}, {other}</answer>"
        )
        corpus.append(f"pick({i * 10}, {i * 7}, {i * 3}) | place({i}, {i + 1}, 0) | {act} {tags}")
    corpus += _env_system_prompts()
    corpus += list(extra_corpus)
    return corpus


def build_tokenizer(vocab_size: int = 4096, extra_corpus: Iterable[str] = ()):
    """Train the byte-level BPE tokenizer and wrap it for transformers (with the chat template).

    Returns a ``transformers`` fast tokenizer with ``len(tok) <= vocab_size``.
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, trainers
    from tokenizers.models import BPE
    from transformers import PreTrainedTokenizerFast

    n_reserved = len(REASONING_TAGS)
    if vocab_size < 512:
        raise ValueError(f"vocab_size={vocab_size} is too small for a byte-level BPE; use >= 512")
    tok = Tokenizer(BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(_QWEN_SPLIT_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - n_reserved,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # Repeat the corpus so every word of it reaches min_frequency.
    tok.train_from_iterator(tokenizer_corpus(extra_corpus) * 2, trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in REASONING_TAGS])
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        bos_token=None,
        model_max_length=32768,
        clean_up_tokenization_spaces=False,
    )
    hf.chat_template = CHAT_TEMPLATE
    for i, t in enumerate(SPECIAL_TOKENS):
        assert hf.convert_tokens_to_ids(t) == i, (t, hf.convert_tokens_to_ids(t))
    assert len(hf) <= vocab_size, (len(hf), vocab_size)
    return hf


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
