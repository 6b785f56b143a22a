"""forward_logits on padded batches equals per-sequence forwards (mRoPE positions with padding)."""

from __future__ import annotations

import pytest
import torch

from vagent.models.forward import forward_hidden, forward_logits, token_entropy, token_logprobs


def _sequences(loaded, make_images):
    """Three prompts with 1, 2 and 0 images (text model: no images) of different lengths."""
    enc = loaded.encoder
    system = enc.encode_system("You are playing Sokoban.").input_ids
    if loaded.is_vision:
        imgs = make_images(3)
        segs = [enc.encode_user("Turn 1 <image> go", imgs[:1]),
                enc.encode_user("<image> then <image> and some more words here", imgs[1:]),
                enc.encode_user("text only")]
    else:
        segs = [enc.encode_user("Turn 1 go"), enc.encode_user("then some more words here"), enc.encode_user("x")]
    reply = enc.tokenizer.encode("<answer>up</answer>", add_special_tokens=False)
    return [(system + s.input_ids + reply, s.pixel_values, s.image_grid_thw) for s in segs]


def _pad(seqs, pad_id, side):
    length = max(len(s) for s, _, _ in seqs)
    ids = torch.full((len(seqs), length), pad_id)
    mask = torch.zeros((len(seqs), length), dtype=torch.long)
    for i, (s, _, _) in enumerate(seqs):
        sl = slice(0, len(s)) if side == "right" else slice(length - len(s), length)
        ids[i, sl] = torch.tensor(s)
        mask[i, sl] = 1
    pixels = [p for _, p, _ in seqs if p is not None]
    grids = [g for _, _, g in seqs if g is not None]
    return ids, mask, (torch.cat(pixels) if pixels else None), (torch.cat(grids) if grids else None)


@pytest.mark.parametrize("which", ["tiny_vlm", "tiny_lm"])
@pytest.mark.parametrize("side", ["right", "left"])
def test_padded_batch_equals_single_sequences(request, which, side, make_images):
    loaded = request.getfixturevalue(which)
    seqs = _sequences(loaded, make_images)
    ids, mask, pixels, grids = _pad(seqs, loaded.encoder.pad_token_id, side)
    with torch.no_grad():
        batch = forward_logits(loaded.model, ids, mask, pixels, grids)
        for i, (s, p, g) in enumerate(seqs):
            single = forward_logits(loaded.model, torch.tensor([s]), torch.ones(1, len(s), dtype=torch.long), p, g)
            torch.testing.assert_close(batch[i][mask[i].bool()], single[0], atol=1e-4, rtol=1e-4)


def test_images_change_the_logits(tiny_vlm, make_images):
    """The image really enters the model: other pixels, other logits (on the tokens after it)."""
    enc = tiny_vlm.encoder
    a, b = enc.encode_user("<image> go", make_images(1, seed=0)), enc.encode_user("<image> go", make_images(1, seed=5))
    ids = torch.tensor([a.input_ids])
    mask = torch.ones_like(ids)
    with torch.no_grad():
        la = forward_logits(tiny_vlm.model, ids, mask, a.pixel_values, a.image_grid_thw)
        lb = forward_logits(tiny_vlm.model, ids, mask, b.pixel_values, b.image_grid_thw)
    assert (la[0, -1] - lb[0, -1]).abs().max() > 1e-4


def test_token_logprobs_and_entropy_match_log_softmax(tiny_lm):
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 11)
    ids = torch.randint(0, 11, (2, 5))
    lp = token_logprobs(logits, ids)
    ref = torch.log_softmax(logits, -1)[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)
    torch.testing.assert_close(lp[:, 1:], ref)
    assert (lp[:, 0] == 0).all()
    hot = token_logprobs(logits, ids, temperature=0.5)
    torch.testing.assert_close(hot[:, 1:], torch.log_softmax(logits / 0.5, -1)[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1))
    p = torch.softmax(logits, -1)
    torch.testing.assert_close(token_entropy(logits), -(p * p.log()).sum(-1))


def test_forward_hidden_shape(tiny_vlm):
    ids = torch.tensor([tiny_vlm.encoder.encode_user("hi").input_ids])
    hidden = forward_hidden(tiny_vlm.model, ids, torch.ones_like(ids))
    assert hidden.shape == (1, ids.shape[1], tiny_vlm.model.config.get_text_config().hidden_size)


def _loss_batch(loaded, make_images):
    """A right-padded micro-batch whose loss mask marks each row's reply tokens (SimpleNamespace:
    the fields policy_forward reads)."""
    from types import SimpleNamespace

    seqs = _sequences(loaded, make_images)
    ids, mask, pixels, grids = _pad(seqs, loaded.encoder.pad_token_id, "right")
    loss = torch.zeros_like(mask, dtype=torch.bool)
    for i, (s, _, _) in enumerate(seqs):
        loss[i, len(s) - 5:len(s)] = True  # the reply's tokens
    return SimpleNamespace(input_ids=ids, attention_mask=mask, pixel_values=pixels, image_grid_thw=grids,
                           loss_mask=loss)


@pytest.mark.parametrize("which", ["tiny_vlm", "tiny_lm", "tiny_qwen3_vl"])
def test_policy_forward_head_only_equals_full_logits(request, which, make_images):
    """policy_forward runs the LM head on loss positions only: its log-probs, entropies and
    gradients there equal those of the full [B, L, V] logits; other positions hold 0."""
    from vagent.recipes.scoring import policy_forward
    loaded = request.getfixturevalue(which)
    model, mb = loaded.model, _loss_batch(loaded, make_images)
    lp, ent = policy_forward(model, mb, 7, with_entropy=True, temperature=0.7)
    (lp.sum() + ent.sum()).backward()
    fast = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    logits = forward_logits(model, mb.input_ids, mb.attention_mask, mb.pixel_values, mb.image_grid_thw) / 0.7
    M = mb.loss_mask
    full_lp = torch.zeros_like(lp)
    full_lp[:, 1:] = torch.log_softmax(logits[:, :-1], -1).gather(-1, mb.input_ids[:, 1:, None])[..., 0]
    p = torch.softmax(logits[:, :-1], -1)
    full_ent = torch.zeros_like(ent)
    full_ent[:, 1:] = -(p * torch.log_softmax(logits[:, :-1], -1)).sum(-1)
    ((full_lp * M).sum() + (full_ent * M).sum()).backward()
    torch.testing.assert_close(lp[M], full_lp[M], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent[M], full_ent[M], atol=1e-5, rtol=1e-5)
    assert (lp[~M] == 0).all() and (ent[~M] == 0).all()
    assert lp[M].abs().min() > 0  # real log-probs, not the zero fill
    assert fast.keys() == {n for n, q in model.named_parameters() if q.grad is not None}
    for n, q in model.named_parameters():
        if q.grad is not None:
            torch.testing.assert_close(fast[n], q.grad, atol=1e-5, rtol=1e-4, msg=n)
    model.zero_grad(set_to_none=True)


def test_policy_forward_falls_back_on_transformed_logits(tiny_lm, make_images, monkeypatch):
    """A model whose config says its logits are not plain lm_head(hidden) (e.g. Gemma's
    soft-capping) gets the full forward: head_only_logits declines it."""
    from vagent.recipes.scoring import head_only_logits, policy_forward
    mb = _loss_batch(tiny_lm, make_images)
    want = mb.loss_mask[:, 1:]
    assert head_only_logits(tiny_lm.model, mb, want) is not None
    with torch.no_grad():
        before = policy_forward(tiny_lm.model, mb, 64)[0]
        monkeypatch.setattr(tiny_lm.model.config, "final_logit_softcapping", 30.0, raising=False)
        assert head_only_logits(tiny_lm.model, mb, want) is None
        after = policy_forward(tiny_lm.model, mb, 64)[0]  # the full path (the tiny LM ignores the field)
    torch.testing.assert_close(before, after, atol=1e-5, rtol=1e-5)
