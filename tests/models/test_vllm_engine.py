"""VLLMEngine against HFEngine on a GPU (marked ``gpu``: skipped without CUDA and vLLM).

Not run on the CPU development machine (vLLM publishes CUDA-only wheels). On a GPU: greedy ids
equal HFEngine's for the first tokens and log-probs agree within bf16 noise; a weight push makes
vLLM follow the trainer's weights (and stamps the version); sleep/wake keeps working; a few PPO
steps with ``rollout.engine: vllm`` train. ``VAGENT_GPU_3B=1`` also runs the comparison on a
random-weight Qwen2.5-VL-3B-shaped model and prints tokens/s and the weight-push time.
"""

from __future__ import annotations

import copy
import importlib.util
import os
import time

import pytest

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM: pip install 'vagent[vllm]'"),
]

from vagent.models.engine import GenerationRequest, HFEngine, SamplingParams  # noqa: E402

GREEDY = SamplingParams(do_sample=False, max_new_tokens=16)


def _requests(loaded, make_images, n=4):
    enc = loaded.encoder
    out = []
    for i in range(n):
        images = make_images(1, seed=i)
        seg = enc.encode_user("Where is the goal? <image>", images)
        ids = list(enc.encode_system("You are an agent.").input_ids) + list(seg.input_ids)
        out.append(GenerationRequest(ids, seg.pixel_values, seg.image_grid_thw, images=tuple(images)))
    return out


def _engines(tmp_path_factory, family="qwen2_5_vl", **shape):
    from vagent.models.loading import load_policy
    from vagent.models.tiny import build_tiny_vlm
    from vagent.models.vllm_engine import VLLMEngine

    path = build_tiny_vlm(tmp_path_factory.mktemp("vllm_model"), family=family, **shape)
    loaded = load_policy(path, device="cuda", dtype="bfloat16")
    return loaded, HFEngine(loaded.model, loaded.encoder), VLLMEngine(path, loaded.encoder, gpu_memory_utilization=0.3)


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    loaded, hf, vl = _engines(tmp_path_factory)
    yield loaded, hf, vl
    vl.close()


def test_greedy_ids_and_logprobs_match_hf(engines, make_images):
    loaded, hf, vl = engines
    reqs = _requests(loaded, make_images)
    a, b = hf.generate(reqs, GREEDY), vl.generate(reqs, GREEDY)
    for x, y in zip(a, b):
        k = 4  # bf16 kernels differ: the first tokens must agree, later ones may drift on near-ties
        assert y.token_ids[:k] == x.token_ids[:k]
        assert y.logprobs[:k] == pytest.approx(x.logprobs[:k], abs=0.05)
        assert y.weights_version == 0


def test_weight_push_follows_the_trainer_and_sleep_wake(engines, make_images):
    loaded, hf, vl = engines
    trainer = copy.deepcopy(loaded.model)
    with torch.no_grad():
        for p in trainer.parameters():
            p.add_(0.05 * torch.randn_like(p))
    reqs = _requests(loaded, make_images, 2)
    vl.sleep()
    t0 = time.perf_counter()
    assert vl.update_weights(trainer, 1) == 1
    print(f"weight push: {time.perf_counter() - t0:.3f} s")
    want = HFEngine(trainer, loaded.encoder).generate(reqs, GREEDY)
    got = vl.generate(reqs, GREEDY)
    for x, y in zip(want, got):
        assert y.token_ids[:4] == x.token_ids[:4] and y.weights_version == 1
    vl.update_weights(loaded.model, 2)


def test_ppo_steps_with_the_colocated_vllm_engine(tmp_path, engines):
    from vagent.recipes.config import load_config
    from vagent.recipes.run import train

    loaded, _, _ = engines
    cfg = load_config(None, ["steps=3", "sft.steps=0", "val.every=0", "model.tiny_pretrain_steps=0",
                             "model.tiny_pretrain_relation_steps=0", f"out_dir={tmp_path}", "device=cuda",
                             "rollout.engine=vllm", "envs.0.n_train=8", "log.progress=false", "log.plot_every=0"])
    run_dir = train(cfg, quiet=True)
    assert (run_dir / "metrics.jsonl").read_text().count('"loss/policy"') == 3


@pytest.mark.skipif(os.environ.get("VAGENT_GPU_3B") != "1", reason="set VAGENT_GPU_3B=1 for the 3B-shaped check")
def test_3b_shaped_greedy_and_tokens_per_s(tmp_path_factory, make_images):
    loaded, hf, vl = _engines(tmp_path_factory, hidden=2048, layers=36, heads=16, kv_heads=2,
                              intermediate=11008, vision_hidden=1280, vision_layers=32, vocab_size=151_936)
    reqs = _requests(loaded, make_images, 16)
    params = SamplingParams(do_sample=False, max_new_tokens=64)
    for name, eng in (("hf", hf), ("vllm", vl)):
        t0 = time.perf_counter()
        outs = eng.generate(reqs, params)
        s = time.perf_counter() - t0
        print(f"{name}: {sum(len(o.token_ids) for o in outs) / s:.1f} tokens/s ({torch.cuda.get_device_name()})")
    a, b = hf.generate(reqs[:4], params), vl.generate(reqs[:4], params)
    assert all(x.token_ids[:2] == y.token_ids[:2] for x, y in zip(a, b))
    vl.close()
