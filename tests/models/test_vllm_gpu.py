"""VLLMEngine on a CUDA GPU (markers ``gpu`` and ``vllm``: skipped without CUDA or without vLLM's CUDA build).

Not run on the CPU machines (tests/models/test_vllm_engine.py covers the CPU build there). On a GPU:
greedy ids equal HFEngine's for the first tokens in bf16 and log-probs agree within bf16 noise; a
push through CUDA IPC (colocated, after ``sleep()``) makes vLLM follow the trainer and stamps the
version; the push time is printed. ``VAGENT_GPU_3B=1`` adds a random-weight Qwen2.5-VL-3B-shaped
model: tokens/s of vLLM vs HF on the same batch and its push time (printed with the card's name).
"""

from __future__ import annotations

import copy
import os
import time

import pytest
import torch

from tests.models.test_vllm_engine import requests
from vagent.models.engine import HFEngine, SamplingParams
from vagent.models.tiny import redraw_weights

pytestmark = [pytest.mark.gpu, pytest.mark.vllm,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

GREEDY = SamplingParams(do_sample=False, max_new_tokens=16)
PREFIX = 4  # bf16 kernels differ: the first tokens must agree, later ones may drift on near-ties


def _engines(tmp_path_factory, **shape):
    from vagent.models.loading import load_policy
    from vagent.models.tiny import build_tiny_vlm
    from vagent.models.vllm_engine import VLLMEngine

    path = build_tiny_vlm(tmp_path_factory.mktemp("vllm_gpu"), **shape)
    loaded = load_policy(path, device="cuda", dtype="bfloat16")
    redraw_weights(loaded.model, seed=1)
    loaded.model.save_pretrained(path)
    return loaded, VLLMEngine(path, loaded.encoder, dtype="bfloat16", gpu_memory_utilization=0.3)


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    loaded, vl = _engines(tmp_path_factory)
    yield loaded, vl
    vl.close()


def test_bf16_greedy_ids_and_logprobs_match_hf(engines, make_images):
    loaded, vl = engines
    reqs = requests(loaded.encoder, make_images, range(4))
    for x, y in zip(HFEngine(loaded.model, loaded.encoder).generate(reqs, GREEDY), vl.generate(reqs, GREEDY)):
        assert y.token_ids[:PREFIX] == x.token_ids[:PREFIX]
        assert y.logprobs[:PREFIX] == pytest.approx(x.logprobs[:PREFIX], abs=0.05)
        assert y.weights_version == 0


def test_ipc_push_after_sleep_follows_the_trainer(engines, make_images):
    loaded, vl = engines
    trainer = copy.deepcopy(loaded.model)
    redraw_weights(trainer, seed=2)
    reqs = requests(loaded.encoder, make_images, range(4))
    vl.generate(reqs, GREEDY)  # the images are in vLLM's caches before the push
    vl.sleep()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    version = vl.update_weights(trainer)
    print(f"weight push (IPC, tiny model): {time.perf_counter() - t0:.3f} s on {torch.cuda.get_device_name()}")
    for x, y in zip(HFEngine(trainer, loaded.encoder).generate(reqs, GREEDY), vl.generate(reqs, GREEDY)):
        assert y.token_ids[:PREFIX] == x.token_ids[:PREFIX] and y.weights_version == version
    vl.update_weights(loaded.model)


@pytest.mark.skipif(os.environ.get("VAGENT_GPU_3B") != "1", reason="set VAGENT_GPU_3B=1 for the 3B-shaped check")
def test_3b_shaped_tokens_per_s_and_push_time(tmp_path_factory, make_images):
    loaded, vl = _engines(tmp_path_factory, hidden=2048, layers=36, heads=16, kv_heads=2, intermediate=11008,
                          vision_hidden=1280, vision_layers=32, vocab_size=151_936)
    hf = HFEngine(loaded.model, loaded.encoder)
    reqs = requests(loaded.encoder, make_images, range(32))
    params = SamplingParams(do_sample=False, max_new_tokens=64)
    rates = {}
    for name, eng in (("hf", hf), ("vllm", vl)):
        eng.generate(reqs[:2], params)  # warm-up
        t0 = time.perf_counter()
        outs = eng.generate(reqs, params)
        rates[name] = sum(len(o.token_ids) for o in outs) / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    vl.update_weights(loaded.model)
    push = time.perf_counter() - t0
    print(f"3B-shaped on {torch.cuda.get_device_name()}: hf {rates['hf']:.0f} tokens/s, vllm {rates['vllm']:.0f} "
          f"tokens/s ({rates['vllm'] / rates['hf']:.1f}x), push {push:.2f} s")
    a, b = hf.generate(reqs[:4], params), vl.generate(reqs[:4], params)
    assert all(x.token_ids[:2] == y.token_ids[:2] for x, y in zip(a, b))
    vl.close()
