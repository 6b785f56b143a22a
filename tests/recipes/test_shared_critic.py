"""A critic sharing the policy's backbone: one scoring pass gives log pi_old and V_old, and the
critic update on that pass's features equals the update that runs the backbone again."""

from __future__ import annotations

import copy

import pytest
import torch

from vagent.models.loading import load_policy
from vagent.models.value import build_critic
from vagent.recipes.scoring import ScoringPass, score_logprobs, score_shared, score_values, shift_right
from vagent.runconfig import UpdateConfig
from vagent.recipes.stages import PPOAdvantages, PPOScores
from vagent.recipes.update import Learner, UpdateContext, critic_update
from vagent.rollout import EnvSpec, HFPolicy, SamplingConfig, rollout
from vagent.rollout.batch import build_token_batch


@pytest.fixture(scope="module")
def setup(tiny_vlm):
    torch.set_num_threads(1)
    loaded = load_policy(tiny_vlm)
    specs = [EnvSpec("frozenlake", {"format": "free_think", "image_size": 64}, s) for s in range(3)]
    eps = rollout(specs, HFPolicy(loaded), SamplingConfig(temperature=1.0, max_new_tokens=12, seed=1), max_turns=2)
    eps = [e for e in eps if e.error is None]
    batch = build_token_batch(eps, mode="concat", pad_token_id=loaded.encoder.pad_token_id)
    return loaded, batch


def test_one_pass_scores_equal_two_passes(setup):
    loaded, batch = setup
    critic = build_critic(loaded, share_backbone=True)
    with torch.no_grad():
        critic.value_head.weight.normal_(0, 0.1)  # values far from 0, so a mismatch would show
    old, values, features = score_shared(loaded.model, critic, batch, ScoringPass(300, 64, 0.7))
    old_ref, _ = score_logprobs(loaded.model, None, batch, ScoringPass(300, 64, 0.7))
    values_ref = score_values(critic, batch, ScoringPass(300, 64, 0.7))
    M = batch.loss_mask
    torch.testing.assert_close(old[M], old_ref[M], atol=1e-5, rtol=1e-5)
    real = batch.attention_mask.bool()
    torch.testing.assert_close(values[real], values_ref[real], atol=1e-5, rtol=1e-5)
    assert features.shape == (*batch.input_ids.shape, critic.value_head.in_features)
    assert values[real].abs().max() > 1e-3
    # features too large to keep: the same scores, no features (the critic update runs the backbone)
    old2, values2, none = score_shared(loaded.model, critic, batch, ScoringPass(300, 64, 0.7), max_feature_bytes=0)
    assert none is None and torch.equal(old2, old) and torch.equal(values2, values)


@pytest.mark.parametrize("mini_batches", [1, 2])
def test_critic_update_on_features_equals_the_backbone_pass(setup, mini_batches):
    loaded, batch = setup
    critic = build_critic(loaded, share_backbone=True)
    _, raw, features = score_shared(loaded.model, critic, batch, ScoringPass(300, 64, 1.0))
    values = shift_right(raw) * batch.loss_mask
    returns = torch.randn_like(values) * batch.loss_mask
    u = UpdateConfig(epochs=2, mini_batches=mini_batches, micro_batch_tokens=300)
    ctx = UpdateContext(torch.device("cpu"), False, 0, 0, None)
    heads, start = [], copy.deepcopy(critic.value_head.state_dict())
    for feats in (features, None):
        c = build_critic(loaded, share_backbone=True)  # the same (shared) backbone, its own head
        c.value_head.load_state_dict(start)
        params = list(c.value_head.parameters())
        opt = torch.optim.AdamW(params, lr=1e-2)
        scores = PPOScores(old_logprobs=values, ref_logprobs=None, values=values, final_values=values[:, 0],
                           features=feats)
        targets = PPOAdvantages(advantages=returns, kl_ref=None, raw=returns, returns=returns,
                                critic_mask=batch.loss_mask)
        stats = critic_update(Learner(c, params, opt), batch, scores, targets, u, ctx, value_clip=0.5)
        assert stats.metrics["loss/value"] > 0 and stats.metrics["critic/grad_norm"] > 0
        heads.append(c.value_head.weight.detach().clone())
    assert not torch.equal(heads[0], start["weight"])  # the head trained
    torch.testing.assert_close(heads[0], heads[1], atol=1e-5, rtol=1e-4)
