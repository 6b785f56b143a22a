"""Chat and image encoding, turn by turn, without ever re-encoding a sampled reply.

Why not ``AutoProcessor``: without torchvision, ``AutoProcessor.from_pretrained`` fails for
Qwen-VL checkpoints ("Can't load video processor", docs/algorithms.md reference section 12). ``ChatEncoder``
drives the tokenizer (with its chat template) and the PIL image processor itself, and expands
each image placeholder the template writes (``<|vision_start|><|image_pad|><|vision_end|>``)
into ``grid_thw.prod() // merge_size**2`` ``<|image_pad|>`` tokens -- what the HF processor does.

Multi-turn without re-encoding (docs/algorithms.md reference section 12, bug 6):

    ids = enc.encode_system(system).input_ids                     # mask 0
    ids += enc.encode_user(obs_text, images).input_ids             # mask 0, ends with the
                                                                   #   assistant generation prompt
    ids += sampled_ids                                             # mask 1 (exactly what was sampled)
    ids += enc.close_assistant(sampled_ids)                        # mask 0 (e.g. <|im_end|> \\n)
    ... next user turn ...

``encode_user`` templates ``[system, user]`` and drops the system prefix's ids (checked to be a
prefix).

The chat template is the model's own: for a VLM the processor's template file
(``chat_template.jinja``, else ``chat_template.json``: what ``AutoProcessor.apply_chat_template``
uses), else the tokenizer's (``tokenizer_config.json``); ``chat_template_source`` says which.
tests/models/test_templates.py checks, for Qwen2-VL, Qwen2.5-VL and Qwen3-VL, that the ids built
for a turn equal the model's own processor's. ``check_incremental`` verifies once that the concatenation equals templating the whole
conversation; run it on your model before training (the tests run it on the tiny models).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import torch
from PIL import Image

IMAGE_PLACEHOLDER = "<image>"
_PROBE_SYSTEM = "You are a helpful assistant."


@dataclass
class EncodedSegment:
    """Token ids of one templated message (or turn) plus the pixels of its images.

    ``pixel_values``: [n_patches, patch_dim] float32 (patch_dim = 3 * temporal_patch * patch**2),
    the images of this segment concatenated in order; None when ``n_images == 0``.
    ``image_grid_thw``: [n_images, 3] long, (t, h, w) in patches per image; the segment holds
    ``image_grid_thw[i].prod() // merge_size**2`` image-pad tokens for image i.
    """

    input_ids: list[int]
    pixel_values: torch.Tensor | None = None
    image_grid_thw: torch.Tensor | None = None
    n_images: int = 0


class ChatEncoder:
    """Tokenizer + chat template + image processor of one model (see the module docstring).

    Attributes:
        tokenizer: the HF tokenizer (with ``chat_template``).
        image_processor: the PIL image processor, or None for a text-only model.
        is_vision: whether images can be encoded.
        eos_token_ids: ids that end a reply (generation_config's eos ids, the tokenizer's eos,
            and ``<|im_end|>`` when the vocabulary has it).
        pad_token_id: the tokenizer's pad id (else the first eos id).
        image_token_id: the ``<|image_pad|>`` id (None for text-only models).
        merge_size: spatial merge of the vision encoder (image tokens = patches / merge_size**2).
        min_pixels, max_pixels: the resize range images are brought into (None for text models).
    """

    def __init__(
        self,
        tokenizer,
        image_processor=None,
        *,
        name: str = "model",
        image_token_id: int | None = None,
        eos_token_ids: Sequence[int] = (),
        pad_token_id: int | None = None,
        max_pixels: int | None = None,
        min_pixels: int | None = None,
    ):
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError(f"tokenizer of {name} has no chat_template; set tokenizer.chat_template")
        self.tokenizer = tokenizer
        self.image_processor = image_processor
        self.name = name
        self.is_vision = image_processor is not None
        eos = list(eos_token_ids)
        for token in (tokenizer.eos_token, "<|im_end|>"):
            tid = tokenizer.convert_tokens_to_ids(token) if token in tokenizer.get_vocab() else None
            if tid is not None and tid not in eos:
                eos.append(tid)
        if not eos:
            raise ValueError(f"{name}: found no eos token id (tokenizer.eos_token and generation_config are empty)")
        self.eos_token_ids: list[int] = eos
        if pad_token_id is None:
            pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]
        self.pad_token_id: int = pad_token_id
        self.image_token_id: int | None = None
        self.merge_size = 1
        self.min_pixels: int | None = None
        self.max_pixels: int | None = None
        self._size_kwargs: dict[str, Any] = {}
        if self.is_vision:
            if image_token_id is None:
                image_token_id = tokenizer.convert_tokens_to_ids("<|image_pad|>")
            self.image_token_id = image_token_id
            self.merge_size = int(getattr(image_processor, "merge_size", 2))
            size = image_processor.size
            lo = min_pixels if min_pixels is not None else size.shortest_edge
            hi = max_pixels if max_pixels is not None else size.longest_edge
            if lo > hi:
                raise ValueError(f"min_pixels={lo} > max_pixels={hi}")
            self.min_pixels, self.max_pixels = lo, hi
            self._size_kwargs = {"size": {"shortest_edge": lo, "longest_edge": hi}}
        #: where the chat template came from (set by from_pretrained)
        self.chat_template_source = "tokenizer"
        self._system_prefix = self._tokenize(self._render([("system", _PROBE_SYSTEM, 0)], False))
        self._end_ids: list[int] | None = None

    # ----------------------------------------------------------------- construction
    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        *,
        max_pixels: int | None = None,
        min_pixels: int | None = None,
        gguf_file: str | None = None,
        trust_remote_code: bool = False,
    ) -> "ChatEncoder":
        """Load the tokenizer (and, for a VLM, the image processor) of a model directory."""
        from transformers import AutoConfig, AutoImageProcessor, AutoTokenizer

        path = Path(path)
        kw = dict(trust_remote_code=trust_remote_code)
        if gguf_file is not None:
            kw["gguf_file"] = gguf_file
        tokenizer = AutoTokenizer.from_pretrained(str(path), **kw)
        config = AutoConfig.from_pretrained(str(path), **kw)
        template, source = _model_chat_template(path, tokenizer.chat_template, is_vision_config(config))
        tokenizer.chat_template = template
        image_processor, image_token_id = None, None
        if is_vision_config(config):
            image_processor = AutoImageProcessor.from_pretrained(str(path), trust_remote_code=trust_remote_code)
            image_token_id = getattr(config, "image_token_id", None)
        encoder = cls(
            tokenizer,
            image_processor,
            name=str(path),
            image_token_id=image_token_id,
            eos_token_ids=_generation_eos_ids(path),
            max_pixels=max_pixels,
            min_pixels=min_pixels,
        )
        encoder.chat_template_source = source
        return encoder

    # ----------------------------------------------------------------- public API
    def encode_system(self, text: str) -> EncodedSegment:
        """The templated system message, e.g. ``<|im_start|>system\\n{text}<|im_end|>\\n``."""
        if IMAGE_PLACEHOLDER in text:
            raise ValueError("images in the system prompt are not supported; put them in a user turn")
        return EncodedSegment(self._tokenize(self._render([("system", text, 0)], False)))

    def encode_user(self, text: str, images: Sequence[Any] = ()) -> EncodedSegment:
        """One user turn, ending with the assistant generation prompt (``<|im_start|>assistant\\n``).

        ``text`` holds one ``<image>`` placeholder per image, in order; images are PIL images
        (or HxWx3 uint8 arrays).
        """
        images = list(images)
        n = text.count(IMAGE_PLACEHOLDER)
        if (n or images) and not self.is_vision:
            raise ValueError(
                f"model {self.name} has no image support; use a text render of the env "
                f"(render=text) or a VLM (got {len(images)} image(s), {n} placeholder(s))"
            )
        if n != len(images):
            raise ValueError(
                f"user text has {n} '{IMAGE_PLACEHOLDER}' placeholder(s) but {len(images)} image(s) "
                "were given; put exactly one placeholder per image, in order"
            )
        rendered = self._render([("system", _PROBE_SYSTEM, 0), ("user", text, n)], True)
        full = self._tokenize(rendered)
        prefix = self._system_prefix
        if full[: len(prefix)] != prefix:
            raise ValueError(
                f"chat template of {self.name} is not incremental: the system message's tokens "
                f"are not a prefix of [system, user]'s tokens.\n{_diff(prefix, full, self.tokenizer)}"
            )
        return self._with_images(full[len(prefix):], images)

    def assistant_end_ids(self) -> list[int]:
        """What the template writes after an assistant message's text (e.g. ``<|im_end|>\\n``)."""
        if self._end_ids is None:
            head = [("system", _PROBE_SYSTEM, 0), ("user", "U", 0)]
            prompt = self._render(head, True)
            full = self._render(head + [("assistant", "A", 0)], False)
            if not full.startswith(prompt + "A"):
                raise ValueError(
                    f"chat template of {self.name} does not render an assistant message as "
                    f"generation prompt + text + end:\n{prompt!r}\n{full!r}"
                )
            self._end_ids = self._tokenize(full[len(prompt) + 1:])
        return list(self._end_ids)

    def close_assistant(self, sampled_ids: Sequence[int]) -> list[int]:
        """Ids to append (mask 0) after a sampled reply so the sequence matches the template.

        If the reply ended with the template's end token (``<|im_end|>``, sampled: mask 1), only
        the rest of the end ids (``\\n``) is appended; otherwise (stop string, length limit,
        another eos) all of ``assistant_end_ids()``.
        """
        end = self.assistant_end_ids()
        if end and sampled_ids and sampled_ids[-1] == end[0]:
            return end[1:]
        return end

    def encode_assistant(self, text: str) -> list[int]:
        """Teacher-forced assistant text + end ids (for SFT targets and ``check_incremental``)."""
        return self._tokenize(text) + self.assistant_end_ids()

    def image_token_count(self, width: int, height: int) -> int:
        """Number of ``<|image_pad|>`` tokens an image of this size becomes."""
        if not self.is_vision:
            raise ValueError(f"model {self.name} has no image support")
        img = Image.new("RGB", (width, height))
        grid = self._process_images([img])[1]
        return int(grid[0].prod()) // self.merge_size**2

    def check_incremental(self, messages: Sequence[Mapping[str, Any]]) -> None:
        """Assert that segment-by-segment encoding equals templating the whole conversation.

        ``messages``: dicts with ``role`` (system first, then user/assistant), ``content`` (str with
        ``<image>`` placeholders) and optional ``images``. Raises ValueError with a token diff.
        """
        if not messages or messages[0]["role"] != "system":
            raise ValueError("check_incremental needs a conversation that starts with a system message")
        ids: list[int] = []
        images: list[Any] = []
        turns = []
        for m in messages:
            role, content, imgs = m["role"], m["content"], list(m.get("images", ()))
            if role == "system":
                ids += self.encode_system(content).input_ids
            elif role == "user":
                ids += self.encode_user(content, imgs).input_ids
            elif role == "assistant":
                ids += self.encode_assistant(content)
            else:
                raise ValueError(f"unknown role {role!r}")
            images += imgs
            turns.append((role, content, content.count(IMAGE_PLACEHOLDER)))
        whole = self._render(turns, messages[-1]["role"] == "user")
        reference = self._with_images(self._tokenize(whole), images).input_ids
        if ids != reference:
            raise ValueError(
                f"incremental encoding of {self.name} differs from templating the whole "
                f"conversation:\n{_diff(ids, reference, self.tokenizer)}"
            )

    # ----------------------------------------------------------------- internals
    def _render(self, turns: Sequence[tuple[str, str, int]], add_generation_prompt: bool) -> str:
        conv = []
        for role, text, n_images in turns:
            if self.is_vision:
                parts: list[dict] = []
                for i, piece in enumerate(text.split(IMAGE_PLACEHOLDER)):
                    if i:
                        parts.append({"type": "image"})
                    if piece:
                        parts.append({"type": "text", "text": piece})
                conv.append({"role": role, "content": parts})
            else:
                conv.append({"role": role, "content": text})
        return self.tokenizer.apply_chat_template(
            conv, tokenize=False, add_generation_prompt=add_generation_prompt
        )

    def _tokenize(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _process_images(self, images: Sequence[Any]) -> tuple[torch.Tensor, torch.Tensor]:
        pil = [_to_pil(im, i) for i, im in enumerate(images)]
        out = self.image_processor(images=pil, return_tensors="pt", **self._size_kwargs)
        return out["pixel_values"].float(), out["image_grid_thw"].long()

    def _with_images(self, ids: list[int], images: Sequence[Any]) -> EncodedSegment:
        """Expand the k-th ``<|image_pad|>`` of ``ids`` into image k's token count."""
        if not images:
            if self.image_token_id is not None and self.image_token_id in ids:
                raise ValueError("text contains an image-pad token but no image was given")
            return EncodedSegment(ids)
        pixel_values, grid = self._process_images(images)
        positions = [i for i, t in enumerate(ids) if t == self.image_token_id]
        if len(positions) != len(images):
            raise ValueError(
                f"the template wrote {len(positions)} image-pad token(s) for {len(images)} image(s); "
                "does the text contain a literal '<|image_pad|>'?"
            )
        out: list[int] = []
        start = 0
        for pos, thw in zip(positions, grid):
            out += ids[start:pos] + [self.image_token_id] * (int(thw.prod()) // self.merge_size**2)
            start = pos + 1
        out += ids[start:]
        return EncodedSegment(out, pixel_values, grid, len(images))


def is_vision_config(config) -> bool:
    """True when a transformers config describes an image-text model (has a vision config)."""
    return getattr(config, "vision_config", None) is not None


def _to_pil(image: Any, index: int) -> Image.Image:
    if isinstance(image, Image.Image):
        return image.convert("RGB")
    if isinstance(image, np.ndarray) and image.ndim == 3 and image.shape[2] in (3, 4):
        return Image.fromarray(image.astype(np.uint8)).convert("RGB")
    raise TypeError(f"image {index}: expected a PIL.Image or an HxWx3 uint8 array, got {type(image).__name__}")


def _generation_eos_ids(path: Path) -> list[int]:
    file = path / "generation_config.json"
    if not file.is_file():
        return []
    eos = json.loads(file.read_text()).get("eos_token_id")
    if eos is None:
        return []
    return [eos] if isinstance(eos, int) else list(eos)


def _model_chat_template(path: Path, tokenizer_template: str | None, is_vision: bool) -> tuple[str, str]:
    """(template, source): a VLM's processor template file first (what its processor applies),
    else the tokenizer's, else a template file; ValueError when the model has none."""
    if is_vision or tokenizer_template is None:
        for name in ("chat_template.jinja", "chat_template.json"):
            file = path / name
            if file.is_file():
                text = file.read_text()
                return (json.loads(text)["chat_template"] if name.endswith(".json") else text), name
    if tokenizer_template is not None:
        return tokenizer_template, "tokenizer_config.json"
    raise ValueError(
        f"{path}: the tokenizer has no chat_template and there is no chat_template.jinja/.json; "
        "vagent needs the model's chat template to build prompts"
    )


def _diff(a: Sequence[int], b: Sequence[int], tokenizer, context: int = 6) -> str:
    """Human-readable first difference between two id lists."""
    i = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))

    def show(ids):
        window = list(ids[max(0, i - context): i + context])
        return f"{window} = {tokenizer.decode(window)!r}"

    return (f"first difference at index {i} (lengths {len(a)} vs {len(b)})\n"
            f"  incremental: {show(a)}\n  reference:   {show(b)}")
