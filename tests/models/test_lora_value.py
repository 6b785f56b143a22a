"""LoRA, the reference model and the critic."""

from __future__ import annotations

import pytest
import torch

from vagent.models.engine import GenerationRequest, HFEngine, SamplingParams
from vagent.models.forward import forward_hidden, forward_logits
from vagent.models.loading import LoraSettings, count_parameters, load_policy
from vagent.models.value import ValueModel, build_critic, reference_model


def _batch(loaded, make_images):
    enc = loaded.encoder
    a = enc.encode_user("first <image> prompt", make_images(1))
    b = enc.encode_user("second prompt, longer, without an image")
    seqs = [enc.encode_system("S").input_ids + s.input_ids for s in (a, b)]
    length = max(map(len, seqs))
    ids = torch.full((2, length), enc.pad_token_id)
    mask = torch.zeros((2, length), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, : len(s)] = 1
    return ids, mask, a.pixel_values, a.image_grid_thw


def test_lora_trains_only_adapters_and_reference_disables_them(tiny_vlm_dir, make_images):
    base = load_policy(tiny_vlm_dir)
    policy = load_policy(tiny_vlm_dir, lora=LoraSettings(r=4, alpha=8, dropout=0.0))
    trainable = [n for n, p in policy.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert not any("visual" in n for n in trainable)  # the vision tower stays frozen
    assert count_parameters(policy.model, trainable_only=True) < 0.2 * count_parameters(policy.model)
    batch = _batch(policy, make_images)
    with torch.no_grad():
        for n, p in policy.model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)  # B starts at 0; make the adapters matter
        base_logits = forward_logits(base.model, *batch)
        policy_logits = forward_logits(policy.model, *batch)
    ref = reference_model(policy)
    ref_logits = ref.forward_logits(*batch)
    mask = batch[1].bool()
    assert (policy_logits - base_logits)[mask].abs().max() > 1e-3
    torch.testing.assert_close(ref_logits[mask], base_logits[mask], atol=1e-5, rtol=1e-5)
    # adapters are back on after the reference pass
    with torch.no_grad():
        torch.testing.assert_close(forward_logits(policy.model, *batch), policy_logits)
    # the PEFT-wrapped VLM generates through the same engine
    seg = policy.encoder.encode_user("<image> go", make_images(1))
    out = HFEngine(policy.model, policy.encoder).generate(
        [GenerationRequest(seg.input_ids, seg.pixel_values, seg.image_grid_thw)],
        SamplingParams(do_sample=False, max_new_tokens=4))[0]
    assert len(out.token_ids) == len(out.logprobs) > 0


def test_frozen_copy_reference_does_not_follow_updates(tiny_lm_dir):
    policy = load_policy(tiny_lm_dir)
    ref = reference_model(policy)
    assert all(not p.requires_grad for p in ref.model.parameters())
    ids = torch.tensor([policy.encoder.encode_user("hello there").input_ids])
    mask = torch.ones_like(ids)
    before = ref(ids, mask)
    with torch.no_grad():
        for p in policy.model.parameters():
            p.add_(0.01)
    torch.testing.assert_close(ref(ids, mask), before)
    assert (forward_logits(policy.model, ids, mask) - before).abs().max() > 1e-3


def test_critic_shape_gradient_and_roundtrip(tiny_vlm, tmp_path, make_images):
    critic = build_critic(tiny_vlm)
    assert critic.backbone_model is not tiny_vlm.model
    batch = _batch(tiny_vlm, make_images)
    values = critic(*batch)
    assert values.shape == batch[0].shape and values.dtype == torch.float32
    assert values.abs().max() < 1.0  # small init
    (values * batch[1]).sum().backward()
    assert critic.value_head.weight.grad.abs().sum() > 0
    grads = [p.grad for n, p in critic.backbone_model.named_parameters() if "layers.0.mlp" in n]
    assert grads and all(g is not None and g.abs().sum() > 0 for g in grads)
    assert all(p.grad is None for p in tiny_vlm.model.parameters())  # the policy is untouched
    critic.save_pretrained(tmp_path / "critic")
    loaded = ValueModel.from_pretrained(tmp_path / "critic")
    with torch.no_grad():
        torch.testing.assert_close(loaded(*batch), critic(*batch))


def test_critic_sharing_the_policy_backbone(tiny_lm_dir, tmp_path):
    policy = load_policy(tiny_lm_dir, gradient_checkpointing=True)
    critic = build_critic(policy, share_backbone=True)
    assert critic.backbone_model is policy.model
    ids = torch.tensor([policy.encoder.encode_user("hello").input_ids])
    critic.train()
    critic(ids, torch.ones_like(ids)).sum().backward()  # works with gradient checkpointing on
    # the value loss trains the head only: no graph (and no gradient) through the shared backbone
    assert policy.model.model.layers[0].mlp.up_proj.weight.grad is None
    head_grad = critic.value_head.weight.grad.clone()
    hidden = forward_hidden(policy.model, ids, torch.ones_like(ids))  # the same loss with a full graph
    critic.value_head.weight.grad = None
    critic.value_head(hidden.float()).sum().backward()
    torch.testing.assert_close(critic.value_head.weight.grad, head_grad)
    assert policy.model.model.layers[0].mlp.up_proj.weight.grad is not None
    critic.save_pretrained(tmp_path / "head")
    assert not (tmp_path / "head" / "config.json").exists()  # only the head is written
    with pytest.raises(ValueError, match="pass backbone_model"):
        ValueModel.from_pretrained(tmp_path / "head")
    again = ValueModel.from_pretrained(tmp_path / "head", backbone_model=policy.model)
    torch.testing.assert_close(again.value_head.weight, critic.value_head.weight)


def test_critic_from_lora_policy_merges_adapters(tiny_lm_dir):
    policy = load_policy(tiny_lm_dir, lora=LoraSettings(r=2, alpha=4, dropout=0.0))
    critic = build_critic(policy)
    assert not any("lora_" in n for n, _ in critic.named_parameters())
    assert all(p.requires_grad for p in critic.parameters())
