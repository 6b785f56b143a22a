"""The tiny models' tokenizer, trained offline, and the chat template (see :mod:`vagent.models.tiny`).

The tokenizer is a byte-level BPE (the Qwen2 pre-tokenizer: NFC, the Qwen split regex, byte
level) trained offline with ``tokenizers`` on a built-in corpus of chat role words, reasoning
tags, action and direction words, env vocabulary, the system prompts of every registered env
(when ``vagent.envs`` is importable) and ``extra_corpus``. Token ids:

- 0..6: ``<|endoftext|> <|im_start|> <|im_end|> <|vision_start|> <|vision_end|> <|image_pad|>
  <|video_pad|>`` (special tokens; the config's ``image_token_id`` etc. point at them);
- then the byte alphabet and the learned merges;
- last: the reasoning tags ``<think> </think> ... <answer> </answer> <tool_call> </tool_call>`` as
  added (non-special) tokens, so each tag is ONE token and survives ``skip_special_tokens``.

The corpus (:func:`tokenizer_corpus`) is deterministic: the same ``extra_corpus`` (and the same
``TOKENIZER_ENVS``) gives the same tokenizer. :mod:`vagent.models.tiny` re-exports these names.
"""

from __future__ import annotations

import logging
from typing import Iterable

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
