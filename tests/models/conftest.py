"""Tiny models built once per test session (about 1 s each after the imports)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from vagent.models.tiny import build_tiny_lm, build_tiny_vlm


@pytest.fixture(scope="session", autouse=True)
def _one_thread():
    # One intra-op thread: on 2 shared cores, 2 threads under load are 20-40x slower (spin-waits).
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_vlm_dir(tmp_path_factory):
    return build_tiny_vlm(tmp_path_factory.mktemp("tiny_vlm"), seed=0)


@pytest.fixture(scope="session")
def tiny_lm_dir(tmp_path_factory):
    return build_tiny_lm(tmp_path_factory.mktemp("tiny_lm"), seed=0)


@pytest.fixture(scope="session")
def tiny_vlm(tiny_vlm_dir):
    from vagent.models.loading import load_policy

    return load_policy(tiny_vlm_dir)


@pytest.fixture(scope="session")
def tiny_lm(tiny_lm_dir):
    from vagent.models.loading import load_policy

    return load_policy(tiny_lm_dir)


def random_images(n: int, size=(96, 96), seed: int = 0) -> list[Image.Image]:
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)) for _ in range(n)]


@pytest.fixture(scope="session")
def make_images():
    """``make_images(n, size=(96, 96), seed=0)`` -> n random RGB PIL images."""
    return random_images


@pytest.fixture(scope="session")
def tiny_qwen3_vl(tmp_path_factory):
    from vagent.models.loading import load_policy

    return load_policy(build_tiny_vlm(tmp_path_factory.mktemp("tiny_qwen3_vl"), family="qwen3_vl", seed=0))


def interrupt_after(n: int):
    """An engine's ``interrupt`` that answers True at its ``n``-th question (after ``n`` decode or
    scheduler steps), once."""
    asked = {"n": 0}

    def interrupt() -> bool:
        asked["n"] += 1
        return asked["n"] == n
    return interrupt
