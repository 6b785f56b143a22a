"""The tiny model builder: saves, loads like a real checkpoint, deterministic, tags are one token."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch

from vagent.models.loading import count_parameters, load_policy
from vagent.models.tiny import REASONING_TAGS, SPECIAL_TOKENS, build_tiny_vlm, mrope_sections


def _digest(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


def test_tiny_vlm_loads_like_a_checkpoint(tiny_vlm_dir, tiny_vlm):
    names = {p.name for p in tiny_vlm_dir.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "preprocessor_config.json",
            "generation_config.json"} <= names
    assert tiny_vlm.is_vision
    assert type(tiny_vlm.model).__name__ == "Qwen2_5_VLForConditionalGeneration"
    assert 1_000_000 < count_parameters(tiny_vlm.model) < 1_600_000  # ~1.3M (docs/algorithms.md reference section 12)
    config = tiny_vlm.model.config
    text = config.get_text_config()
    assert sum(text.rope_parameters["mrope_section"]) == text.hidden_size // text.num_attention_heads // 2
    assert tiny_vlm.encoder.image_token_count(96, 96) == 9


def test_same_seed_gives_identical_files(tmp_path, tiny_vlm_dir):
    again = build_tiny_vlm(tmp_path / "again", seed=0)
    assert _digest(again) == _digest(tiny_vlm_dir)
    other = build_tiny_vlm(tmp_path / "other", seed=1)
    digest = _digest(other)
    assert digest["model.safetensors"] != _digest(tiny_vlm_dir)["model.safetensors"]
    assert digest["tokenizer.json"] == _digest(tiny_vlm_dir)["tokenizer.json"]


def test_build_leaves_global_rng_alone(tmp_path):
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build_tiny_vlm(tmp_path / "m", hidden=64, layers=1)
    assert torch.equal(torch.rand(3), expected)


def test_tags_and_specials_are_single_tokens(tiny_vlm):
    tok = tiny_vlm.encoder.tokenizer
    config = tiny_vlm.model.config
    for tag in REASONING_TAGS + SPECIAL_TOKENS + ("user", "assistant", "system"):
        assert len(tok.encode(tag, add_special_tokens=False)) == 1, tag
    assert config.image_token_id == tok.convert_tokens_to_ids("<|image_pad|>")
    assert config.vision_start_token_id == tok.convert_tokens_to_ids("<|vision_start|>")
    assert config.vision_end_token_id == tok.convert_tokens_to_ids("<|vision_end|>")
    assert len(tok) <= config.get_text_config().vocab_size
    reply = "<think><observation>The box is above me.</observation></think><answer>up, left</answer>"
    ids = tok.encode(reply, add_special_tokens=False)
    assert tok.decode(ids, skip_special_tokens=True) == reply  # tags survive skip_special_tokens


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen3_vl"])
def test_other_families_build_and_run(tmp_path, family, make_images):
    from vagent.models.forward import forward_logits

    loaded = load_policy(build_tiny_vlm(tmp_path / family, family=family))
    enc = loaded.encoder
    seg = enc.encode_user("look <image>", make_images(1))
    assert seg.input_ids.count(enc.image_token_id) == 9
    ids = enc.encode_system("S").input_ids + seg.input_ids
    logits = forward_logits(loaded.model, torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.long),
                            seg.pixel_values, seg.image_grid_thw)
    assert logits.shape == (1, len(ids), loaded.model.config.get_text_config().vocab_size)
    assert torch.isfinite(logits).all()


def test_mrope_sections_sum_to_half_head_dim():
    for head_dim in (16, 32, 64, 128):
        for family in ("qwen2_5_vl", "qwen3_vl"):
            assert sum(mrope_sections(head_dim, family)) == head_dim // 2
    assert mrope_sections(128, "qwen2_5_vl") == [16, 24, 24]  # the real Qwen2.5-VL split


def test_missing_directory_error_suggests_init_tiny(tmp_path):
    with pytest.raises(FileNotFoundError, match="vagent model init-tiny"):
        load_policy(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="not a model directory"):
        load_policy(tmp_path / "empty")


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_rope_theta_reaches_the_saved_config_and_changes_the_forward(tmp_path, family, make_images):
    """rope_theta=None keeps the real family's base; a given base is saved in config.json, loads
    back through from_pretrained, and the same weights then give different logits (the rotary
    base really is used by the forward pass)."""
    from vagent.models.forward import forward_logits
    from vagent.models.tiny import FAMILY_ROPE_THETA

    default = load_policy(build_tiny_vlm(tmp_path / "default", family=family, hidden=32, layers=1))
    small = load_policy(build_tiny_vlm(tmp_path / "small", family=family, hidden=32, layers=1, rope_theta=100))
    theta = lambda m: m.model.config.get_text_config().rope_parameters["rope_theta"]  # noqa: E731
    assert theta(default) == FAMILY_ROPE_THETA[family] and theta(small) == 100.0
    for a, b in zip(default.model.state_dict().values(), small.model.state_dict().values()):
        assert torch.equal(a, b)  # same seed, same weights: only the rotary base differs
    seg = default.encoder.encode_user("look <image> at the board", make_images(1))
    ids = torch.tensor([default.encoder.encode_system("S").input_ids + seg.input_ids])
    attn = torch.ones_like(ids)
    out = [forward_logits(m.model, ids, attn, seg.pixel_values, seg.image_grid_thw) for m in (default, small)]
    assert not torch.allclose(out[0], out[1], atol=1e-5)


def test_init_tiny_cli_takes_rope_theta(tmp_path):
    import json
    import subprocess
    import sys

    out = tmp_path / "m"
    subprocess.run([sys.executable, "-m", "vagent.cli", "model", "init-tiny", str(out), "--family", "qwen3_vl",
                    "--hidden", "32", "--layers", "1", "--rope-theta", "250"], check=True, capture_output=True)
    assert json.loads((out / "config.json").read_text())["text_config"]["rope_parameters"]["rope_theta"] == 250.0
