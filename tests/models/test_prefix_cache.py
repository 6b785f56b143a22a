"""HFEngine prefix reuse: a turn that extends the last call's prompt + reply feeds only its new
tokens, and the replies and log-probs equal a fresh prefill's (HF ``generate``)."""

from __future__ import annotations

import copy

import pytest
import torch

from vagent.models.engine import GenerationRequest, HFEngine, SamplingParams

GREEDY = SamplingParams(do_sample=False, max_new_tokens=10)


def first_turn(loaded, make_images, n=4):
    enc = loaded.encoder
    system = enc.encode_system("You are playing FrozenLake.").input_ids
    images = make_images(n, seed=1)
    out = []
    for i in range(n):
        k = 1 if loaded.is_vision and i % 2 == 0 else 0
        seg = enc.encode_user(f"Turn 1 of game {i}: " + "<image> " * k + "what now?" + " more" * i, images[i:i + k])
        out.append(GenerationRequest(system + seg.input_ids, seg.pixel_values, seg.image_grid_thw))
    return out


def next_turn(loaded, make_images, request, reply_ids, i):
    """The request of the next turn: the last prompt, the reply, the turn's end, a new observation."""
    enc = loaded.encoder
    vision = loaded.is_vision
    seg = enc.encode_user(f"Turn 2 of game {i}: " + ("<image> " if vision else "") + "and now?",
                          make_images(1, seed=10 + i) if vision else [])
    ids = request.input_ids + list(reply_ids) + list(enc.close_assistant(list(reply_ids))) + list(seg.input_ids)
    pixels = [p for p in (request.pixel_values, seg.pixel_values) if p is not None]
    grids = [g for g in (request.image_grid_thw, seg.image_grid_thw) if g is not None]
    return GenerationRequest(ids, torch.cat(pixels) if pixels else None, torch.cat(grids) if grids else None)


def assert_same(a, b):
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    assert [o.finish_reason for o in a] == [o.finish_reason for o in b]
    for x, y in zip(a, b):
        torch.testing.assert_close(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-4, rtol=0)


@pytest.fixture(params=["tiny_vlm", "tiny_qwen3_vl", "tiny_lm"])
def loaded(request):
    return request.getfixturevalue(request.param)


@pytest.mark.parametrize("params", [GREEDY, SamplingParams(max_new_tokens=10, seed=5, temperature=0.8, top_k=40)])
def test_next_turn_reuses_the_cache_and_equals_a_fresh_prefill(loaded, make_images, params):
    cached = HFEngine(loaded.model, loaded.encoder)
    fresh = HFEngine(loaded.model, loaded.encoder, prefix_cache=False)
    turn1 = first_turn(loaded, make_images)
    out1 = cached.generate(turn1, params)
    assert_same(out1, fresh.generate(turn1, params))
    assert cached.stats["reused_tokens"] == 0
    # the episodes that go on, in another order (one ended)
    keep = [3, 0, 2]
    turn2 = [next_turn(loaded, make_images, turn1[i], out1[i].token_ids, i) for i in keep]
    out2 = cached.generate(turn2, params)
    # every prompt token of turn 1 and every reply token but (at most) the last came from the cache
    held = sum(len(turn1[i].input_ids) + len(out1[i].token_ids) - 1 for i in keep)
    assert cached.stats["reused_tokens"] >= held
    assert_same(out2, fresh.generate(turn2, params))


def test_a_new_prompt_beside_continued_ones(tiny_vlm, make_images):
    cached = HFEngine(tiny_vlm.model, tiny_vlm.encoder)
    fresh = HFEngine(tiny_vlm.model, tiny_vlm.encoder, prefix_cache=False)
    turn1 = first_turn(tiny_vlm, make_images, n=2)
    out1 = cached.generate(turn1, GREEDY)
    mixed = [next_turn(tiny_vlm, make_images, turn1[1], out1[1].token_ids, 1)] + first_turn(tiny_vlm, make_images, n=3)[2:]
    reused = cached.stats["reused_tokens"]
    assert_same(cached.generate(mixed, GREEDY), fresh.generate(mixed, GREEDY))
    assert cached.stats["reused_tokens"] - reused >= len(turn1[1].input_ids)


def test_changed_weights_drop_the_cache(tiny_lm, make_images):
    model = copy.deepcopy(tiny_lm.model)
    cached = HFEngine(model, tiny_lm.encoder)
    turn1 = first_turn(tiny_lm, make_images, n=2)
    out1 = cached.generate(turn1, GREEDY)
    turn2 = [next_turn(tiny_lm, make_images, r, o.token_ids, i) for i, (r, o) in enumerate(zip(turn1, out1))]
    # an optimizer step changes the weights in place: nothing may be reused
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(**tiny_lm.encoder.tokenizer("hello there", return_tensors="pt"), labels=None).logits.sum().backward()
    opt.step()
    out2 = cached.generate(turn2, GREEDY)
    assert cached.stats["reused_tokens"] == 0
    assert_same(out2, HFEngine(model, tiny_lm.encoder, prefix_cache=False).generate(turn2, GREEDY))
    # so does loading weights (same values, still a new version)
    turn3 = [next_turn(tiny_lm, make_images, r, o.token_ids, i) for i, (r, o) in enumerate(zip(turn2, out2))]
    model.load_state_dict(tiny_lm.model.state_dict())
    cached.generate(turn3, GREEDY)
    assert cached.stats["reused_tokens"] == 0
    # while an unchanged model reuses
    turn4 = [next_turn(tiny_lm, make_images, turn3[0], cached.generate(turn3, GREEDY)[0].token_ids, 0)]
    cached.generate(turn4, GREEDY)
    assert cached.stats["reused_tokens"] >= len(turn3[0].input_ids)
    cached.reset_cache()
    before = cached.stats["reused_tokens"]
    cached.generate([next_turn(tiny_lm, make_images, turn4[0], [5], 0)], GREEDY)
    assert cached.stats["reused_tokens"] == before
