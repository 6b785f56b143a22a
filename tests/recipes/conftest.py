"""Shared fixtures of the recipe tests: tiny models (built once per session) and a small config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vagent.runconfig import load_config

# The smallest settings that still exercise every stage (multi-turn, images, critic, validation).
SMALL = [
    "steps=2", "sft.steps=0", "val.every=0", "threads=1", "model.cache_dir=UNUSED",
    "envs.0.n_train=2", "envs.0.n_val=2", "envs.0.config.image_size=64",
    "rollout.max_turns=2", "rollout.max_new_tokens=12",
    "update.epochs=1", "update.mini_batches=1", "update.warmup_steps=0", "ppo.critic_warmup_steps=0",
    "log.tensorboard=false", "log.progress=false", "log.rollouts_every=1", "log.checkpoint_every=1",
    "log.plot_every=0", "log.plots=false",
]


def hf_metadata_dir(tmp_path: Path, params: float = 3.75e9) -> Path:
    """A Qwen2.5-VL-3B checkpoint's metadata as Hugging Face writes it (config.json and the
    safetensors index), no weights: what the paper recipes' pre-flight reads, and anything that
    tried to load it would fail."""
    d = tmp_path / "Qwen2.5-VL-3B-Instruct"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "qwen2_5_vl", "torch_dtype": "bfloat16"}))
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": int(params * 2)},
                                                                "weight_map": {}}))
    return d


@pytest.fixture(scope="session")
def tiny_vlm(tmp_path_factory) -> Path:
    from vagent.models.tiny import build_tiny_vlm

    return build_tiny_vlm(tmp_path_factory.mktemp("models") / "tiny-vlm", hidden=64, layers=2, image_size=64)


@pytest.fixture(scope="session")
def tiny_lm(tmp_path_factory) -> Path:
    from vagent.models.tiny import build_tiny_lm

    return build_tiny_lm(tmp_path_factory.mktemp("models") / "tiny-lm", hidden=64, layers=1)


def small_overrides(tmp_path: Path, model_dir: Path, *extra: str) -> list[str]:
    return SMALL + [f"out_dir={tmp_path / 'runs'}", f"model.path={model_dir}", *extra]


@pytest.fixture
def small_cfg(tmp_path, tiny_vlm):
    """``small_cfg(*overrides)`` -> a RunConfig on the tiny VLM writing under tmp_path."""
    def make(*extra: str):
        return load_config(None, small_overrides(tmp_path, tiny_vlm, *extra))

    return make
