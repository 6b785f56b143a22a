"""HFEngine: batched generation, stop strings, eos, log-probs, determinism."""

from __future__ import annotations

import math

import pytest
import torch

from vagent.models.engine import GenerationRequest, HFEngine, SamplingParams
from vagent.models.stops import cut_reply, find_stop
from vagent.models.forward import forward_logits, token_logprobs


# ----------------------------------------------------------------- pure cut functions
def _decode(ids):
    """A toy detokenizer: token i is the string VOCAB[i] (some tokens span several characters)."""
    vocab = ["a", "b", "</", "ans", "wer>", "<", "/answer>", "x", "!"]
    return "".join(vocab[i] for i in ids)


def test_find_stop_earliest_token_multi_token_stop():
    ids = [0, 1, 2, 3, 4, 7, 5, 6, 7]  # "ab</answer>x</answer>x"
    assert find_stop(ids, _decode, ["</answer>"]) == 5  # cut right after "wer>"
    assert find_stop(ids, _decode, ["x"]) == 6
    assert find_stop(ids, _decode, ["zzz"]) is None
    assert find_stop(ids, _decode, []) is None
    assert find_stop(ids, _decode, ["</answer>", "b"]) == 2  # the earliest of several stop strings


def test_cut_reply_reasons():
    eos = [8]
    assert cut_reply([0, 1, 8, 7], eos, _decode, ["</answer>"]) == (3, "eos")  # eos kept
    assert cut_reply([2, 3, 4, 8], eos, _decode, ["</answer>"]) == (3, "stop")  # stop before eos
    assert cut_reply([0, 1, 7], eos, _decode, ["</answer>"]) == (3, "length")
    assert cut_reply([0, 8, 2, 3, 4], eos, _decode, ["</answer>"]) == (2, "eos")  # stop after eos ignored


def test_sampling_params_validation():
    with pytest.raises(ValueError, match="greedy"):
        SamplingParams(temperature=0.0)
    with pytest.raises(ValueError, match="tuple of non-empty"):
        SamplingParams(stop_strings="</answer>")
    SamplingParams(temperature=0.0, do_sample=False)


# ----------------------------------------------------------------- end to end
def _requests(loaded, make_images, n=8):
    """n prompts of different lengths with 0, 1 or 2 images each."""
    enc = loaded.encoder
    system = enc.encode_system("You are playing FrozenLake.").input_ids
    imgs = make_images(2)
    out = []
    for i in range(n):
        k = i % 3 if loaded.is_vision else 0
        seg = enc.encode_user(f"Turn {i}: " + "<image> " * k + "what now?" + " more" * i, imgs[:k])
        out.append(GenerationRequest(system + seg.input_ids, seg.pixel_values, seg.image_grid_thw))
    return out


@pytest.fixture(scope="module", params=[True, False], ids=["prefix_cache", "hf_generate"])
def vlm_engine(tiny_vlm, request):
    """Both decoding paths must keep the engine's semantics (the module docstring of engine.py)."""
    return HFEngine(tiny_vlm.model, tiny_vlm.encoder, prefix_cache=request.param)


def test_batched_generation_mixed_image_counts(tiny_vlm, vlm_engine, make_images):
    reqs = _requests(tiny_vlm, make_images)
    outs = vlm_engine.generate(reqs, SamplingParams(max_new_tokens=16, seed=0))
    assert len(outs) == len(reqs)
    for o in outs:
        assert o.finish_reason in ("eos", "length", "stop")
        assert len(o.logprobs) == len(o.token_ids) > 0
        assert all(math.isfinite(x) and x <= 0 for x in o.logprobs)
        assert o.text == tiny_vlm.encoder.tokenizer.decode(o.token_ids, skip_special_tokens=True)
        if o.finish_reason == "length":
            assert len(o.token_ids) == 16
        if o.finish_reason == "eos":
            assert o.token_ids[-1] in tiny_vlm.encoder.eos_token_ids


def test_greedy_is_deterministic_and_batch_independent(tiny_vlm, vlm_engine, make_images):
    reqs = _requests(tiny_vlm, make_images)
    params = SamplingParams(do_sample=False, max_new_tokens=12)
    first = vlm_engine.generate(reqs, params)
    assert [o.token_ids for o in vlm_engine.generate(reqs, params)] == [o.token_ids for o in first]
    for i in (0, 1, 2):  # 0, 1 and 2 images: alone == inside the left-padded batch
        alone = vlm_engine.generate([reqs[i]], params)[0]
        assert alone.token_ids == first[i].token_ids
        torch.testing.assert_close(torch.tensor(alone.logprobs), torch.tensor(first[i].logprobs), atol=1e-4, rtol=0)


def test_seeded_sampling_reproducible_and_rng_restored(tiny_vlm, vlm_engine, make_images):
    reqs = _requests(tiny_vlm, make_images, n=4)
    params = SamplingParams(max_new_tokens=10, seed=123, temperature=1.5)
    torch.manual_seed(7)
    a = vlm_engine.generate(reqs, params)
    after = torch.rand(1)
    torch.manual_seed(7)
    b = vlm_engine.generate(reqs, params)
    assert torch.equal(torch.rand(1), after)  # the caller's RNG stream is untouched
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    c = vlm_engine.generate(reqs, SamplingParams(max_new_tokens=10, seed=124, temperature=1.5))
    assert [o.token_ids for o in a] != [o.token_ids for o in c]


@pytest.mark.parametrize("params", [SamplingParams(do_sample=False, max_new_tokens=10),
                                    SamplingParams(max_new_tokens=10, seed=3, temperature=0.7, top_k=50, top_p=0.9)])
def test_logprobs_are_the_models_logprobs_at_the_sampling_temperature(tiny_vlm, vlm_engine, make_images, params):
    """Teacher-forcing prompt + reply through forward_logits gives the engine's log-probs: those of
    logits / temperature when sampling (the distribution drawn from, before top-k/top-p), of the
    raw logits when greedy."""
    reqs = _requests(tiny_vlm, make_images, n=3)
    outs = vlm_engine.generate(reqs, params)
    for r, o in zip(reqs, outs):
        ids = torch.tensor([r.input_ids + o.token_ids])
        with torch.no_grad():
            logits = forward_logits(tiny_vlm.model, ids, torch.ones_like(ids), r.pixel_values, r.image_grid_thw)
        tau = params.temperature if params.do_sample else 1.0
        expected = token_logprobs(logits, ids, temperature=tau)[0, len(r.input_ids):]
        torch.testing.assert_close(torch.tensor(o.logprobs), expected, atol=1e-4, rtol=0)
        if tau != 1.0:  # and not those of temperature 1
            assert not torch.allclose(torch.tensor(o.logprobs), token_logprobs(logits, ids)[0, len(r.input_ids):],
                                      atol=1e-3)


def test_stop_string_cuts_at_earliest_token(tiny_vlm, vlm_engine, make_images):
    """Pick a piece of a sampled reply as the stop string; with the same seed the engine must
    stop right after its first occurrence (no mocking: the model really generates it)."""
    reqs = _requests(tiny_vlm, make_images, n=3)
    params = SamplingParams(max_new_tokens=24, seed=11)
    free = vlm_engine.generate(reqs, params)
    decode = vlm_engine.decode
    assert len(free[1].token_ids) >= 6, "reply too short to pick a stop string from"
    stop = decode(free[1].token_ids[4:6])
    assert stop
    outs = vlm_engine.generate(reqs, SamplingParams(max_new_tokens=24, seed=11, stop_strings=(stop,)))
    for f, o in zip(free, outs):
        expected_n, expected_reason = cut_reply(f.token_ids, tiny_vlm.encoder.eos_token_ids, decode, (stop,))
        assert (len(o.token_ids), o.finish_reason) == (expected_n, expected_reason)
        assert o.token_ids == f.token_ids[:expected_n]
    assert outs[1].finish_reason == "stop"
    assert stop in outs[1].text and stop not in decode(outs[1].token_ids[:-1])


def test_text_model_engine(tiny_lm, make_images):
    engine = HFEngine(tiny_lm.model, tiny_lm.encoder)
    reqs = _requests(tiny_lm, make_images, n=4)
    outs = engine.generate(reqs, SamplingParams(do_sample=False, max_new_tokens=8))
    for r, o in zip(reqs, outs):
        alone = engine.generate([r], SamplingParams(do_sample=False, max_new_tokens=8))[0]
        assert alone.token_ids == o.token_ids
        assert len(o.logprobs) == len(o.token_ids)
    with pytest.raises(ValueError, match="no image support"):
        engine.generate([GenerationRequest([1, 2], torch.zeros(36, 1176), torch.tensor([[1, 6, 6]]))],
                        SamplingParams(max_new_tokens=2))


def test_engine_restores_training_mode(tiny_lm):
    engine = HFEngine(tiny_lm.model, tiny_lm.encoder)
    tiny_lm.model.train()
    try:
        engine.generate([GenerationRequest(tiny_lm.encoder.encode_user("hi").input_ids)],
                        SamplingParams(do_sample=False, max_new_tokens=2))
        assert tiny_lm.model.training
    finally:
        tiny_lm.model.eval()


def test_placeholder_tokens_are_never_sampled(tiny_vlm, vlm_engine, make_images):
    enc = tiny_vlm.encoder
    video_pad = enc.tokenizer.convert_tokens_to_ids("<|video_pad|>")
    assert {enc.image_token_id, video_pad} <= set(vlm_engine.suppress_token_ids)
    reqs = _requests(tiny_vlm, make_images, n=4)
    greedy = SamplingParams(do_sample=False, max_new_tokens=6)
    first = vlm_engine.generate(reqs, greedy)
    banned = sorted({o.token_ids[0] for o in first})  # what greedy picks first, now forbidden
    engine = HFEngine(tiny_vlm.model, enc, suppress_token_ids=banned)
    for o_free, o in zip(first, engine.generate(reqs, greedy)):
        assert not set(o.token_ids) & set(banned)
        assert o.logprobs[0] < o_free.logprobs[0]  # the model's own log-prob of the runner-up
    hot = engine.generate(reqs, SamplingParams(max_new_tokens=20, seed=0, temperature=3.0))
    assert not any(set(o.token_ids) & set(banned) for o in hot)


def test_vllm_engine_without_vllm_says_how_to_install(tiny_vlm):
    import importlib.util

    from vagent.models.vllm_engine import VLLMEngine, collapse_image_runs

    assert collapse_image_runs([1, 5, 5, 5, 2, 5, 5, 3], 5) == [1, 5, 2, 5, 3]
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed")
    with pytest.raises(ImportError, match="pip install"):
        VLLMEngine("unused", tiny_vlm.encoder)
