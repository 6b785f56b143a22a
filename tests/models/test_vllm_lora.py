"""A LoRA policy served as an adapter by vLLM's CPU build (``VLLMEngine(lora_rank=r)``, marker ``vllm``):
a push sends only the adapter (a ``LoRARequest`` per weights version), greedy ids and log-probs
equal the merged policy's (HFEngine on the same LoRA policy), a second push is followed, and an
adapter of a higher rank than the engine's is refused. Also reports the bytes an adapter push
moves against a merged push (docs/results.md)."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.models.conftest import random_images
from tests.models.test_vllm_engine import ENGINE_KW, GREEDY, assert_same_replies, requests
from vagent.models.engine import HFEngine
from vagent.models.tiny import redraw_weights

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def lora_engine(tmp_path_factory):
    from vagent.models.loading import load_policy
    from vagent.models.tiny import build_tiny_vlm
    from vagent.models.vllm_engine import VLLMEngine

    path = build_tiny_vlm(tmp_path_factory.mktemp("vllm_lora"), family="qwen2_5_vl", seed=0)
    loaded = load_policy(path)
    redraw_weights(loaded.model, seed=1)
    loaded.model.save_pretrained(path)
    engine = VLLMEngine(path, loaded.encoder, lora_rank=8, **ENGINE_KW)
    yield loaded, engine
    engine.close()


def lora_policy(model, r=4, seed=5):
    from vagent.models.loading import LoraSettings, apply_lora

    policy = apply_lora(copy.deepcopy(model), LoraSettings(r=r, alpha=8, dropout=0.0))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in policy.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return policy


def test_adapter_push_serves_the_lora_policy_and_follows_the_next_push(lora_engine):
    from vagent.models.vllm_weights import weights_to_push

    loaded, engine = lora_engine
    assert engine.takes_adapters
    reqs = requests(loaded.encoder, random_images, range(50, 54))
    for seed in (5, 6):  # two versions of the adapter: the engine follows each push
        policy = lora_policy(loaded.model, seed=seed)
        version = engine.update_weights(policy)
        want = HFEngine(policy, loaded.encoder).generate(reqs, GREEDY)
        assert len({tuple(o.token_ids) for o in want}) >= 2, "precondition: replies depend on the image"
        assert_same_replies(want, engine.generate(reqs, GREEDY), version)
    adapter = engine.stats["adapter_bytes"]
    merged = sum(t.numel() * t.element_size() for _, t in weights_to_push(policy))
    print(f"\nadapter push {adapter} bytes, merged push {merged} bytes ({merged / adapter:.0f}x)")
    assert adapter * 10 < merged


def test_an_adapter_above_the_engine_rank_is_refused(lora_engine):
    loaded, engine = lora_engine
    policy = lora_policy(loaded.model, r=16)
    before = engine.weights_version
    with pytest.raises(ValueError, match="rank 16 is above the engine's lora_rank 8"):
        engine.update_weights(policy)
    assert engine.weights_version == before
