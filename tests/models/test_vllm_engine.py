"""VLLMEngine on vLLM's CPU build against HFEngine and the trainer (marker ``vllm``).

Run in .venv-vllm (scripts/vllm-env): ``.venv-vllm/bin/python -m pytest -q -m vllm``; skipped
elsewhere (tests/conftest.py), failed instead when VAGENT_REQUIRE_VLLM=1. One engine per model
family for the module (vLLM starts in 30-120 s on 2 cores). The tiny models' weights are re-drawn
so that greedy replies depend on the image (the default init answers every prompt with one
repeated token, which would make parity vacuous); fp32 on both sides, so ids are equal and
log-probs agree to float rounding.
"""

from __future__ import annotations

import copy

import pytest
import torch

from tests.models.conftest import random_images
from vagent.models.engine import GenerationRequest, HFEngine, SamplingParams
from vagent.models.tiny import redraw_weights

pytestmark = pytest.mark.vllm

GREEDY = SamplingParams(do_sample=False, max_new_tokens=12)
LOGPROB_TOL = 1e-4  # fp32, different kernels: measured <= 1e-5
#: a small fixed KV cache (vLLM's CPU build would take gpu_memory_utilization of the RAM otherwise)
ENGINE_KW = dict(dtype="float32", kv_cache_memory_bytes=256 << 20, max_model_len=2048)


def requests(encoder, make_images, seeds, text="Where is the goal? <image>"):
    out = []
    for s in seeds:
        images = make_images(1, seed=s)
        seg = encoder.encode_user(text, images)
        ids = list(encoder.encode_system("You are an agent.").input_ids) + list(seg.input_ids)
        out.append(GenerationRequest(ids, seg.pixel_values, seg.image_grid_thw, images=tuple(images)))
    return out


def assert_same_replies(want, got, version):
    for x, y in zip(want, got, strict=True):
        assert y.token_ids == x.token_ids and y.finish_reason == x.finish_reason
        assert y.logprobs == pytest.approx(x.logprobs, abs=LOGPROB_TOL)
        assert y.weights_version == version


def _engine(tmp_path_factory, family):
    from vagent.models.loading import load_policy
    from vagent.models.tiny import build_tiny_vlm
    from vagent.models.vllm_engine import VLLMEngine

    path = build_tiny_vlm(tmp_path_factory.mktemp(f"vllm_{family}"), family=family, seed=0)
    loaded = load_policy(path)
    redraw_weights(loaded.model, seed=1)
    loaded.model.save_pretrained(path)
    return loaded, VLLMEngine(path, loaded.encoder, **ENGINE_KW)


@pytest.fixture(scope="module")
def qwen25(tmp_path_factory):
    loaded, engine = _engine(tmp_path_factory, "qwen2_5_vl")
    yield loaded, engine
    engine.close()


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    loaded, engine = _engine(tmp_path_factory, "qwen3_vl")
    yield loaded, engine
    engine.close()
    engine.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        engine.generate(requests(loaded.encoder, random_images, [0]), GREEDY)


def _parity(loaded, engine, make_images):
    reqs = requests(loaded.encoder, make_images, range(5))
    want = HFEngine(loaded.model, loaded.encoder).generate(reqs, GREEDY)
    assert len({tuple(o.token_ids) for o in want}) >= 3, "precondition: the replies depend on the image"
    assert_same_replies(want, engine.generate(reqs, GREEDY), engine.weights_version)


def test_greedy_ids_and_logprobs_equal_hf_qwen2_5_vl(qwen25, make_images):
    _parity(*qwen25, make_images)


def test_seeded_sampling_repeats_and_depends_on_the_request_seed_only(qwen25, make_images):
    loaded, engine = qwen25
    reqs = requests(loaded.encoder, make_images, range(4))
    for i, r in enumerate(reqs):
        r.seed = 100 + i
    params = SamplingParams(temperature=1.0, max_new_tokens=12, seed=7)
    first = engine.generate(reqs, params)
    again = engine.generate(reqs, params)
    assert [o.token_ids for o in again] == [o.token_ids for o in first]
    alone = engine.generate([reqs[2]], params)[0]  # the same request in another batch
    assert alone.token_ids == first[2].token_ids
    reqs[2].seed = 999
    assert engine.generate([reqs[2]], params)[0].token_ids != first[2].token_ids
    batch_seeded = [GenerationRequest(r.input_ids, r.pixel_values, r.image_grid_thw, images=r.images) for r in reqs]
    a, b = engine.generate(batch_seeded, params), engine.generate(batch_seeded, params)
    assert [o.token_ids for o in a] == [o.token_ids for o in b]


def _ppo_step(model, encoder, reqs, outs, lr=0.05):
    """One PPO-clip step (vagent.rl.losses) on the sampled replies, advantages +1 / -1 alternating."""
    from vagent.models.forward import forward_logits, token_logprobs
    from vagent.rl.losses import ppo_policy_loss

    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for i, (r, o) in enumerate(zip(reqs, outs)):
        ids = torch.tensor([r.input_ids + o.token_ids])
        logits = forward_logits(model, ids, torch.ones_like(ids), r.pixel_values, r.image_grid_thw)
        lp = token_logprobs(logits, ids)[:, len(r.input_ids):]
        old = torch.tensor([o.logprobs])
        adv = torch.full_like(old, 1.0 if i % 2 == 0 else -1.0)
        losses.append(ppo_policy_loss(lp, old, adv, torch.ones_like(old)).loss)
    torch.stack(losses).mean().backward()
    opt.step()


def test_after_a_ppo_update_and_a_push_vllm_follows_the_trainer(qwen25, make_images):
    loaded, engine = qwen25
    trainer = copy.deepcopy(loaded.model)
    reqs = requests(loaded.encoder, make_images, range(10, 14))
    sampled = engine.generate(reqs, SamplingParams(temperature=1.0, max_new_tokens=8, seed=3))
    before = {n: p.detach().clone() for n, p in trainer.named_parameters()}
    _ppo_step(trainer, loaded.encoder, reqs, sampled)
    assert any(not torch.equal(p, before[n]) for n, p in trainer.named_parameters())
    version = engine.update_weights(trainer)
    assert version == engine.weights_version >= 1
    fresh = requests(loaded.encoder, make_images, range(20, 25))
    assert_same_replies(HFEngine(trainer, loaded.encoder).generate(fresh, GREEDY), engine.generate(fresh, GREEDY),
                        version)
    engine.update_weights(loaded.model)


def test_an_image_seen_before_the_push_is_encoded_with_the_new_weights(qwen25, make_images):
    """Without the encoder / multimodal / prefix cache reset this crashes (``Encoder cache miss``) or
    reuses the old weights' image embeddings and KV blocks."""
    loaded, engine = qwen25
    reqs = requests(loaded.encoder, make_images, range(30, 34))
    old = engine.generate(reqs, GREEDY)  # the images (and prompts) are now in vLLM's caches
    trainer = copy.deepcopy(loaded.model)
    redraw_weights(trainer, seed=2)
    # a state dict as a sharded trainer gathers it: named parameters only (no tied lm_head.weight)
    version = engine.update_state(dict(trainer.named_parameters()))
    want = HFEngine(trainer, loaded.encoder).generate(reqs, GREEDY)
    assert [o.token_ids for o in want] != [o.token_ids for o in old], "precondition: the new weights reply otherwise"
    assert_same_replies(want, engine.generate(reqs, GREEDY), version)
    engine.update_weights(loaded.model)


def test_a_lora_policy_is_served_merged(qwen25, make_images):
    from vagent.models.loading import LoraSettings, apply_lora

    loaded, engine = qwen25
    policy = apply_lora(copy.deepcopy(loaded.model), LoraSettings(r=4, alpha=8))
    with torch.no_grad():
        for n, p in policy.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.3, generator=torch.Generator().manual_seed(5))
    version = engine.update_weights(policy)
    reqs = requests(loaded.encoder, make_images, range(40, 43))
    assert_same_replies(HFEngine(policy, loaded.encoder).generate(reqs, GREEDY), engine.generate(reqs, GREEDY), version)
    engine.update_weights(loaded.model)


def test_placeholder_tokens_are_never_sampled_and_logprobs_stay_the_models(qwen25, make_images):
    """The image / video pad tokens' output rows are made equal to the token the model picks first,
    so they tie for the argmax: HFEngine masks them, vLLM must too, and its log-probs (biased by the
    suppression inside vLLM) must still be the model's own, as HFEngine records them."""
    loaded, engine = qwen25
    reqs = requests(loaded.encoder, make_images, range(50, 53))
    first = HFEngine(loaded.model, loaded.encoder).generate(reqs, GREEDY)[0].token_ids[0]
    policy = copy.deepcopy(loaded.model)
    embed = policy.get_input_embeddings().weight  # tied to the LM head
    with torch.no_grad():
        for t in engine.suppress_token_ids:
            embed[t] = embed[first]
    version = engine.update_weights(policy)
    want = HFEngine(policy, loaded.encoder).generate(reqs, GREEDY)
    assert want[0].token_ids[0] == first and want[0].logprobs[0] < -0.9, "precondition: the placeholders hold mass"
    got = engine.generate(reqs, GREEDY)
    assert not any(t in engine.suppress_token_ids for o in got for t in o.token_ids)
    assert_same_replies(want, got, version)
    engine.update_weights(loaded.model)


def test_unservable_head_size_is_refused_before_vllm_starts(tmp_path, qwen25):
    from vagent.models.tiny import build_tiny_vlm
    from vagent.models.vllm_engine import VLLMEngine

    loaded, engine = qwen25
    if engine.device != "cpu":
        pytest.skip("the head-size list is the CPU build's")
    path = build_tiny_vlm(tmp_path / "h16", hidden=64, layers=1)  # 4 heads of 16
    with pytest.raises(ValueError, match=r"head size is 16.*32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512"):
        VLLMEngine(path, loaded.encoder, **ENGINE_KW)


def test_greedy_ids_and_logprobs_equal_hf_qwen3_vl(qwen3, make_images):
    _parity(*qwen3, make_images)


def _dict_path_logprobs(engine, requests_, params, seeds):
    """The recorded log-probs as the engine computed them before (vLLM's dict log-probs of the
    sampled token and the placeholders, corrected token by token with ``unsuppressed_logprob``)."""
    from vagent.models.vllm_logprobs import unsuppressed_logprob

    sps = []
    for s in seeds:
        sp = engine._sampling(params, s).clone()
        sp.flat_logprobs, sp.logprobs = False, len(engine.suppress_token_ids)
        sps.append(sp)
    outs = engine.llm.generate([engine._prompt(i, r) for i, r in enumerate(requests_)], sps, use_tqdm=False)
    temperature = params.temperature if params.do_sample else 1.0
    ids = [list(o.outputs[0].token_ids) for o in outs]
    fixed = [[unsuppressed_logprob(st[t].logprob, [st[s].logprob for s in engine.suppress_token_ids if s != t], temperature)
              for t, st in zip(o.outputs[0].token_ids, o.outputs[0].logprobs)] for o in outs]
    biased = [[st[t].logprob for t, st in zip(o.outputs[0].token_ids, o.outputs[0].logprobs)] for o in outs]
    return ids, fixed, biased


@pytest.mark.parametrize("params", [SamplingParams(do_sample=True, temperature=0.7, max_new_tokens=24),
                                    SamplingParams(do_sample=False, max_new_tokens=24)], ids=["sampled", "greedy"])
def test_recorded_logprobs_equal_the_per_token_placeholder_correction(qwen25, make_images, params):
    """The flat, vectorised correction (issue 48 part 5) records what the per-token one over vLLM's
    dict log-probs did, within 1e-6, on replies where the correction itself moves log-probs by more
    than that (the placeholders hold mass in the re-drawn tiny model)."""
    from dataclasses import replace

    loaded, engine = qwen25
    seeds = list(range(200, 206))
    reqs = [replace(r, seed=s) for r, s in zip(requests(loaded.encoder, make_images, range(60, 66)), seeds)]
    got = engine.generate(reqs, params)
    ids, fixed, biased = _dict_path_logprobs(engine, reqs, params, seeds)
    moved = 0.0
    for out, want_ids, want, raw in zip(got, ids, fixed, biased):
        assert out.token_ids == want_ids[:len(out.token_ids)]
        assert out.logprobs == pytest.approx(want[:len(out.logprobs)], abs=1e-6, rel=0)
        moved = max(moved, max(abs(a - b) for a, b in zip(want, raw)))
    assert moved > 1e-6, "precondition: the correction matters on these replies"


def test_a_request_without_images_is_refused_before_vllm_starts(qwen25, make_images):
    """Issue 44 point 5: the engine starts on first use, after its requests are checked: a request
    without its raw images (or with too many, or too long) fails at once, and vLLM never starts."""
    import time

    from vagent.models.vllm_engine import VLLMEngine

    loaded, running = qwen25
    t0 = time.perf_counter()
    engine = VLLMEngine(running._llm_args["model"], loaded.encoder, **{**ENGINE_KW, "max_model_len": 512},
                        max_images_per_prompt=1)
    (good,) = requests(loaded.encoder, make_images, [0])
    bare = GenerationRequest(good.input_ids, good.pixel_values, good.image_grid_thw)  # no images=
    with pytest.raises(ValueError, match=r"request 0: VLLMEngine needs the raw images.*1 image\(s\) in the prompt, 0 given"):
        engine.generate([bare], GREEDY)
    images = make_images(2, seed=1)
    seg = loaded.encoder.encode_user("<image> and <image>", images)
    two = GenerationRequest(list(seg.input_ids), seg.pixel_values, seg.image_grid_thw, images=tuple(images))
    with pytest.raises(ValueError, match="2 images in one prompt, above the engine's max_images_per_prompt 1"):
        engine.generate([two], GREEDY)
    long = GenerationRequest(list(good.input_ids) + [good.input_ids[-1]] * 600, good.pixel_values, good.image_grid_thw,
                             images=good.images)
    with pytest.raises(ValueError, match="max_model_len 512"):
        engine.generate([long], GREEDY)
    assert not engine.started and time.perf_counter() - t0 < 15
    engine.close()
    with pytest.raises(RuntimeError, match="closed"):
        engine.generate([good], GREEDY)
