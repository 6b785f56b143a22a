"""Packed forwards (update.packing) equal padded ones: hidden states, log-probs, entropies, critic
values and their gradients, for every tiny family, on mixed-length rows with 0, 1 and 3 images."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch

from vagent.models.forward import forward_hidden, forward_logits
from vagent.models.loading import load_policy
from vagent.models.packing import pack
from vagent.models.tiny import build_tiny_lm, build_tiny_vlm
from vagent.models.value import ValueModel
from vagent.recipes.scoring import critic_forward, policy_forward

FAMILIES = ["qwen2_5_vl", "qwen2_vl", "qwen3_vl", "qwen2", "llama"]


@pytest.fixture(scope="module", params=FAMILIES)
def loaded(request, tmp_path_factory):
    fam = request.param
    build = build_tiny_lm if fam in ("qwen2", "llama") else build_tiny_vlm
    return load_policy(build(tmp_path_factory.mktemp(fam), family=fam, seed=0))


def micro_batch(loaded, make_images, side="right"):
    """Four rows of different lengths: 1 image, 3 images, none, 1 image (text LMs: no images); the
    loss mask on each row's replies; right- or left-padded."""
    enc = loaded.encoder
    imgs = make_images(5, seed=3)
    texts = [("Turn 1 <image> go", imgs[:1]), ("<image> then <image> and more <image> words", imgs[1:4]),
             ("text only, a longer row of plain words here", []), ("<image>", imgs[4:])]
    reply = enc.tokenizer.encode("<think>left</think><answer>up</answer>", add_special_tokens=False)
    rows = []
    for i, (text, im) in enumerate(texts):
        seg = enc.encode_user(text, im) if loaded.is_vision else enc.encode_user(text.replace("<image>", "x"))
        rows.append((seg.input_ids + reply * (i + 1), len(reply) * (i + 1), seg.pixel_values, seg.image_grid_thw))
    L = max(len(r[0]) for r in rows)
    ids = torch.full((len(rows), L), enc.pad_token_id)
    mask = torch.zeros((len(rows), L), dtype=torch.long)
    loss = torch.zeros((len(rows), L), dtype=torch.bool)
    for b, (s, n_reply, _, _) in enumerate(rows):
        start = 0 if side == "right" else L - len(s)
        ids[b, start:start + len(s)] = torch.tensor(s)
        mask[b, start:start + len(s)] = 1
        loss[b, start + len(s) - n_reply:start + len(s)] = True
    pixels = [r[2] for r in rows if r[2] is not None]
    grids = [r[3] for r in rows if r[3] is not None]
    return SimpleNamespace(input_ids=ids, attention_mask=mask, loss_mask=loss,
                           pixel_values=torch.cat(pixels) if pixels else None,
                           image_grid_thw=torch.cat(grids) if grids else None)


def grads(model):
    out = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return out


@pytest.mark.parametrize("side", ["right", "left"])
def test_packed_hidden_and_logits_equal_padded(loaded, make_images, side):
    mb = micro_batch(loaded, make_images, side)
    args = (loaded.model, mb.input_ids, mb.attention_mask, mb.pixel_values, mb.image_grid_thw)
    real = mb.attention_mask.bool()
    with torch.no_grad():
        for fn in (forward_hidden, forward_logits):
            padded, packed = fn(*args), fn(*args, packed=True)
            assert packed.shape == padded.shape
            torch.testing.assert_close(packed[real], padded[real], atol=1e-5, rtol=1e-5)
            assert (packed[~real] == 0).all()
    p = pack(loaded.model, mb.input_ids, mb.attention_mask, mb.image_grid_thw)
    assert p.input_ids.shape == (1, int(real.sum()))  # no padding in the packed sequence
    assert p.position_ids.shape[0] == (4 if loaded.is_vision else 1)


def test_packed_logprobs_entropy_and_gradients_equal_padded(loaded, make_images):
    mb = micro_batch(loaded, make_images)
    model, M = loaded.model, mb.loss_mask
    out = {}
    for packed in (False, True):
        lp, ent = policy_forward(model, mb, 16, with_entropy=True, temperature=0.7, packed=packed)
        ((lp * M).sum() + (ent * M).sum()).backward()
        out[packed] = (lp, ent, grads(model))
    (lp0, ent0, g0), (lp1, ent1, g1) = out[False], out[True]
    torch.testing.assert_close(lp1, lp0, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent1, ent0, atol=1e-5, rtol=1e-5)
    assert lp0[M].abs().min() > 0
    assert g0.keys() == g1.keys() and g0
    for n in g0:
        torch.testing.assert_close(g1[n], g0[n], atol=1e-5, rtol=1e-4, msg=lambda m, n=n: f"{n}: {m}")


def test_packed_critic_values_and_gradients_equal_padded(loaded, make_images):
    mb = micro_batch(loaded, make_images)
    critic = ValueModel(loaded.model, shares_backbone=False)
    with torch.no_grad():
        critic.value_head.weight.normal_(0, 0.1)
    real = mb.attention_mask.bool()
    out = {}
    for packed in (False, True):
        v = critic_forward(critic, mb, packed)
        (v[real] ** 2).mean().backward()
        out[packed] = (v, grads(critic))
    torch.testing.assert_close(out[True][0][real], out[False][0][real], atol=1e-5, rtol=1e-5)
    assert out[False][0][real].abs().max() > 1e-3
    assert out[False][1].keys() == out[True][1].keys() and out[False][1]
    for n in out[False][1]:
        torch.testing.assert_close(out[True][1][n], out[False][1][n], atol=1e-5, rtol=1e-3, msg=lambda m, n=n: f"{n}: {m}")


def test_family_without_packed_path_runs_padded_with_one_warning(make_images, tmp_path, caplog):
    """A model type the packing module does not know runs the padded forward, warning once by name."""
    loaded = load_policy(build_tiny_lm(tmp_path, family="qwen2", seed=0))
    mb = micro_batch(loaded, make_images)
    args = (loaded.model, mb.input_ids, mb.attention_mask)
    with torch.no_grad():
        padded = forward_hidden(*args)
        loaded.model.config.model_type = "mystery_lm"
        with caplog.at_level(logging.WARNING, logger="vagent.models.packing"):
            a, b = forward_hidden(*args, packed=True), forward_hidden(*args, packed=True)
    assert torch.equal(a, padded) and torch.equal(b, padded)  # the very same padded computation
    warned = [r for r in caplog.records if "mystery_lm" in r.getMessage()]
    assert len(warned) == 1 and "no packed path" in warned[0].getMessage()


def test_packed_forward_attends_row_by_row_without_a_mask(loaded, make_images, monkeypatch):
    """With sdpa (the CPU default) the packed forward runs one causal SDPA call per row on that
    row's slice (no N x N mask), and the model's attention setting is restored afterwards."""
    from vagent.models import packing

    mb = micro_batch(loaded, make_images)
    config = loaded.model.config.get_text_config()
    assert packing.row_attention_config(loaded.model) is config and config._attn_implementation == "sdpa"
    seen: list[tuple[int, int, bool]] = []  # (query length, key length, causal) of each text-attention call
    real_sdpa = packing.sdpa_attention_forward

    def spy(module, q, k, v, mask, **kw):
        assert mask is None
        seen.append((q.shape[2], k.shape[2], kw["is_causal"]))
        return real_sdpa(module, q, k, v, mask, **kw)

    monkeypatch.setattr(packing, "sdpa_attention_forward", spy)
    with torch.no_grad():
        forward_hidden(loaded.model, mb.input_ids, mb.attention_mask, mb.pixel_values, mb.image_grid_thw, packed=True)
    lengths = mb.attention_mask.sum(-1).tolist()
    layers = loaded.model.config.get_text_config().num_hidden_layers
    assert seen == [(n, n, True) for n in lengths] * layers
    assert config._attn_implementation == "sdpa"


def test_gradient_checkpointing_packs_through_the_block_diagonal_mask(make_images, tmp_path):
    """Under gradient checkpointing (the backward re-runs each layer outside the forward's scope)
    the packed forward keeps transformers' block-diagonal mask: log-probs and gradients still
    equal the padded forward's."""
    from vagent.models import packing

    loaded = load_policy(build_tiny_vlm(tmp_path, family="qwen3_vl", seed=0))
    model = loaded.model
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    assert packing.row_attention_config(model) is None
    mb = micro_batch(loaded, make_images)
    M = mb.loss_mask
    out = {}
    for packed in (False, True):
        lp, _ = policy_forward(model, mb, 16, packed=packed)
        (lp * M).sum().backward()
        out[packed] = (lp, grads(model))
    torch.testing.assert_close(out[True][0], out[False][0], atol=1e-5, rtol=1e-5)
    for n in out[False][1]:
        torch.testing.assert_close(out[True][1][n], out[False][1][n], atol=1e-5, rtol=1e-4, msg=lambda m, n=n: f"{n}: {m}")
