"""The prompt vagent builds for a turn is the model's own: for each Qwen-VL generation (2, 2.5, 3)
the ids (and pixels) ``ChatEncoder`` builds turn by turn equal what the model's own processor class
builds for the same messages and images.

What is compared: transformers' ``Qwen2VLProcessor`` / ``Qwen2_5_VLProcessor`` / ``Qwen3VLProcessor``
(its ``apply_chat_template`` with the model directory's chat template, then ``__call__``, which
tokenizes and expands each ``<|image_pad|>`` to ``grid_thw.prod() // merge_size**2`` tokens) on a
tiny random-weight checkpoint of that family built from config (``vagent.models.tiny``: the
family's config, vision patch size and image-processor settings, the tiny tokenizer). The
processor is constructed without its video processor: ``AutoProcessor`` needs torchvision for
that, which is not installable here; images never touch it. The checkpoints' chat template is the
tiny model's own file (a Qwen2-VL-style template: for a conversation that starts with a system
message, as vagent's always do, Qwen2-VL, Qwen2.5-VL and Qwen3-VL-Instruct templates render the
same text); ``test_the_model_directory_template_is_used`` shows that a checkpoint shipping a
different template gets prompts from that one.
"""

from __future__ import annotations

import hashlib
import json
from unittest import mock

import numpy as np
import pytest
from PIL import Image

from vagent.models.processor import ChatEncoder
from vagent.models.tiny import build_tiny_vlm

FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")


def own_processor(family: str, encoder: ChatEncoder):
    """The family's transformers processor on the checkpoint's tokenizer, image processor and
    template (no video processor: see the module docstring)."""
    from transformers import Qwen2_5_VLProcessor, Qwen2VLProcessor, Qwen3VLProcessor
    from transformers.processing_utils import ProcessorMixin

    cls = {"qwen2_vl": Qwen2VLProcessor, "qwen2_5_vl": Qwen2_5_VLProcessor, "qwen3_vl": Qwen3VLProcessor}[family]
    with mock.patch.object(ProcessorMixin, "check_argument_for_proper_class", lambda self, name, arg: None):
        return cls(image_processor=encoder.image_processor, tokenizer=encoder.tokenizer, video_processor=None,
                   chat_template=encoder.tokenizer.chat_template)


def image(seed: int, size=(100, 80)) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))


def parts(text: str) -> list[dict]:
    out = []
    for i, piece in enumerate(text.split("<image>")):
        if i:
            out.append({"type": "image"})
        if piece:
            out.append({"type": "text", "text": piece})
    return out


SYSTEM = "You are an agent on a frozen lake. Reply <think>...</think><answer>...</answer>."
TURNS = [("Turn 1. The board:\n<image>\nWhere do you go?", "<think>The goal is below.</think><answer>Down</answer>"),
         ("Turn 2. <image> and the map <image> after your move.", None)]


@pytest.fixture(scope="module", params=FAMILIES)
def family_dir(request, tmp_path_factory):
    d = build_tiny_vlm(tmp_path_factory.mktemp(request.param), family=request.param, hidden=32, layers=1,
                       vision_hidden=32, vision_layers=1, image_size=64)
    return request.param, d


def test_turn_prompt_equals_the_processor(family_dir):
    family, d = family_dir
    enc = ChatEncoder.from_pretrained(d)
    proc = own_processor(family, enc)
    images = [image(0), image(1, (64, 64)), image(2, (40, 120))]
    messages = [{"role": "system", "content": [{"type": "text", "text": SYSTEM}]}]
    ids = enc.encode_system(SYSTEM).input_ids
    used = []
    pixels = []
    for user, reply in TURNS:
        n = user.count("<image>")
        turn_images, images = images[:n], images[n:]
        used += turn_images
        messages.append({"role": "user", "content": parts(user)})
        seg = enc.encode_user(user, turn_images)
        ids += seg.input_ids
        pixels.append(seg.pixel_values)
        # the prompt of this turn, as the processor builds it from the whole conversation so far
        text = proc.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        ref = proc(text=[text], images=used, return_tensors="pt")
        assert ids == ref["input_ids"][0].tolist(), f"{family}: turn prompt differs from the processor's"
        import torch

        assert torch.equal(torch.cat(pixels), ref["pixel_values"].float())
        if reply is not None:
            ids += enc.encode_assistant(reply)
            messages.append({"role": "assistant", "content": [{"type": "text", "text": reply}]})
    merge = enc.image_processor.merge_size
    assert ids.count(enc.image_token_id) == int(ref["image_grid_thw"].prod(-1).sum()) // merge**2


def test_the_model_directory_template_is_used(tmp_path):
    """A VLM checkpoint's processor template file (chat_template.json) is the one applied, not a
    built-in copy and not the tokenizer's."""
    d = build_tiny_vlm(tmp_path / "m", family="qwen2_5_vl", hidden=32, layers=1, vision_hidden=32,
                       vision_layers=1, image_size=64)
    own = (d / "chat_template.jinja").read_text().replace("<|im_start|>{{ message['role'] }}\n",
                                                          "<|im_start|>{{ message['role'] }}\nRole: {{ message['role'] }}. ")
    (d / "chat_template.jinja").unlink()
    (d / "chat_template.json").write_text(json.dumps({"chat_template": own}))
    enc = ChatEncoder.from_pretrained(d)
    assert enc.chat_template_source == "chat_template.json"
    proc = own_processor("qwen2_5_vl", enc)
    messages = [{"role": "system", "content": [{"type": "text", "text": SYSTEM}]},
                {"role": "user", "content": parts("Look: <image>")}]
    ref = proc(text=[proc.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)],
               images=[image(3)], return_tensors="pt")
    ids = enc.encode_system(SYSTEM).input_ids + enc.encode_user("Look: <image>", [image(3)]).input_ids
    assert ids == ref["input_ids"][0].tolist()
    assert "Role: user." in enc.tokenizer.decode(ids)


# sha256 of the ids below, recorded with the code before the chat template moved to "the model's
# own" (commit dc4770e): the default run's prompts must stay token-identical
DEFAULT_RUN_PROMPTS = (1150, "c41f0bf58b5fe10f382ee1b7468acf339fe9b360b0ad9bb6e78cacee3f4286f2")


def test_default_run_prompt_ids_unchanged(tmp_path):
    """The default run's tiny model (its family, sizes and tokenizer) encodes the default env's
    system prompt and turns (two val seeds, one train seed; two turns each) to the same ids as
    before: the default run stays bit-identical."""
    from vagent.envs import make
    from vagent.runconfig import load_config
    from vagent.seeds import split_seeds

    cfg = load_config()
    m, e = cfg.model, cfg.envs[0]
    d = build_tiny_vlm(tmp_path / "m", family=m.tiny_family, hidden=m.tiny_hidden, layers=m.tiny_layers,
                       image_size=m.tiny_image_size, seed=m.tiny_seed, rope_theta=m.tiny_rope_theta or None)
    enc = ChatEncoder.from_pretrained(d)
    assert enc.chat_template_source == "chat_template.jinja"  # the tiny model ships its own
    env = make(e.name, **e.config)
    ids = enc.encode_system(env.system_prompt()).input_ids
    for seed in split_seeds("val", 2) + split_seeds("train", 1):
        obs, _ = env.reset(seed)
        ids += enc.encode_user(obs.text, obs.images).input_ids
        ids += enc.encode_assistant("<think>x</think><answer>Down</answer>")
        r = env.step("<answer>Down</answer>")
        ids += enc.encode_user(r.obs.text, r.obs.images).input_ids
    assert (len(ids), hashlib.sha256(repr(ids).encode()).hexdigest()) == DEFAULT_RUN_PROMPTS
