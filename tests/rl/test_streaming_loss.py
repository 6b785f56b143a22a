"""The streaming rollout's loss (``rollout.max_staleness >= 1``) is decoupled PPO.

On a hand-built batch whose rows mix weights versions (per-token behaviour log-probs of versions
0..2, the trainer's proximal log-probs, advantages, prompt and padding positions off the loss
mask), the recipe's path (``stages.off_policy`` -> ``update.actor_update``, one SGD step of a tiny
real causal LM) gives the loss and gradient of the reference objective
``vagent.rl.decoupled.decoupled_ppo_loss`` (truncated behaviour weights ``min(pi_prox / pi_behav,
C)``, ``C = rollout_correction.is_threshold``) to 1e-6, for each loss aggregation. Without
streaming the anchor and weights are as before, and a rollout correction set in the config is
kept under streaming.
"""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen2Config

from vagent.runconfig import load_config
from vagent.recipes.scoring import policy_forward
from vagent.recipes.stages import Advantages, Scores, off_policy
from vagent.recipes.update import Learner, UpdateContext, actor_update
from vagent.rl.correction import CorrectionSettings, correct
from vagent.rl.decoupled import decoupled_ppo_loss
from vagent.rollout.batch import TokenBatch

STREAM = ["rollout.max_staleness=2", "rollout.replicas=1"]
#: one optimizer step on the whole batch, no entropy, KL or gradient clipping: the update's
#: gradient is the policy loss's alone
PLAIN = ["update.epochs=1", "update.mini_batches=1", "update.entropy_coef=0", "update.kl_coef=0",
         "update.grad_clip=0", "update.micro_batch_tokens=4096"]
VOCAB = 48

#: rows as (real length, [(first, end, weights version) of each sampled span]); the rest of a row
#: is prompt / observation (mask 0) and right padding
ROWS = [
    (10, [(3, 6, 0), (7, 10, 2)]),  # a trajectory whose turns span versions 0 and 2
    (7, [(2, 7, 1)]),  # one turn, version 1, three padding positions
    (9, [(1, 5, 1), (6, 9, 2)]),  # versions 1 and 2
    (4, []),  # no sampled token (all prompt): counts in no mean
]


def _model(seed: int = 0) -> torch.nn.Module:
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                         tie_word_embeddings=True)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).float()
    with torch.no_grad():  # weights large enough that the token log-probs differ from row to row
        for p in model.parameters():
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape) / p.shape[-1] ** 0.5 * 2)
    return model


def _batch(seed: int = 0) -> tuple[TokenBatch, torch.Tensor]:
    """A TokenBatch of ROWS (behaviour log-probs filled in later) and each token's weights version."""
    g = torch.Generator().manual_seed(seed)
    B, L = len(ROWS), max(n for n, _ in ROWS)
    ids = torch.zeros(B, L, dtype=torch.long)
    att = torch.zeros(B, L, dtype=torch.long)
    mask = torch.zeros(B, L, dtype=torch.bool)
    versions = torch.full((B, L), -1, dtype=torch.long)
    turn_end = torch.zeros(B, L, dtype=torch.bool)
    turn_index = torch.full((B, L), -1, dtype=torch.long)
    for b, (n, spans) in enumerate(ROWS):
        ids[b, :n] = torch.randint(1, VOCAB, (n,), generator=g)
        att[b, :n] = 1
        for k, (lo, hi, v) in enumerate(spans):
            mask[b, lo:hi], versions[b, lo:hi], turn_index[b, lo:hi] = True, v, k
            turn_end[b, hi - 1] = True
    batch = TokenBatch(
        input_ids=ids, attention_mask=att, loss_mask=mask, old_logprobs=torch.zeros(B, L), turn_end_mask=turn_end,
        token_rewards=turn_end.float(), turn_index=turn_index, bootstrap_index=torch.full((B,), -1),
        truncated=torch.zeros(B, dtype=torch.bool), episode_returns=torch.ones(B), group_ids=torch.arange(B),
        traj_ids=torch.arange(B), row_turn=torch.full((B,), -1), pixel_values=None, image_grid_thw=None,
        state_keys=[[] for _ in range(B)], n_images=torch.zeros(B, dtype=torch.long), episode_index=torch.arange(B))
    return batch, versions


def _mixed(cfg, model, seed: int = 0):
    """(batch with behaviour log-probs, Scores with the proximal ones, advantages, versions) around
    the current policy: the proximal policy is off the current one by up to 0.5 nats per token (so
    that the PPO clip is active on some tokens), the behaviour policy of version v is 2 - v
    updates older than the proximal, further off with each update (so that some weights exceed C)."""
    batch, versions = _batch()
    g = torch.Generator().manual_seed(seed + 1)
    M = batch.loss_mask
    with torch.no_grad():
        current, _ = policy_forward(model, batch, cfg.update.logprob_chunk, temperature=cfg.rollout.temperature,
                                    packed=cfg.update.packing)
    prox = (current + (torch.rand(current.shape, generator=g) - 0.5)) * M
    drift = (2 - versions).clamp(min=0).float() * 0.6 * torch.randn(M.shape, generator=g)  # 0 for version 2
    behav = (prox - drift) * M
    batch.old_logprobs = behav
    adv = torch.randn(M.shape, generator=g) * M
    return batch, Scores(old_logprobs=prox, ref_logprobs=None), adv, versions


CASES = [  # (recipe overrides, loss aggregation, PPO clip overrides)
    (["recipe=ppo"], "token-mean", []),
    (["recipe=grpo", "rollout.group_size=2"], "token-mean", ["update.clip_high=0.28"]),
    (["recipe=grpo", "rollout.group_size=2"], "seq-mean-token-mean", ["update.clip_high=0.28", "update.dual_clip=3"]),
    (["recipe=grpo", "rollout.group_size=2"], "seq-mean-token-sum", []),
]


@pytest.mark.parametrize("recipe, agg, clip", CASES, ids=[f"{c[0][0][7:]}-{c[1]}" for c in CASES])
def test_the_streaming_update_is_decoupled_ppo_with_truncated_behaviour_weights(recipe, agg, clip):
    cfg = load_config(None, [*recipe, *STREAM, *PLAIN, f"update.loss_agg={agg}", *clip])
    assert cfg.rollout_correction.is_level == "none"  # streaming needs no correction set: it brings its own
    model = _model()
    batch, scores, adv, versions = _mixed(cfg, model)
    M, prox, behav = batch.loss_mask, scores.old_logprobs, batch.old_logprobs
    C = cfg.rollout_correction.is_threshold
    # the batch exercises what the objective does: mixed versions in a row, weights above C, clipped ratios
    assert any(len({int(v) for v in versions[b][M[b]]}) > 1 for b in range(M.shape[0]))
    assert bool(((prox - behav > math.log(C)) & M).any()) and bool(((prox - behav < 0) & M).any())

    off = off_policy(cfg, batch, scores)
    assert torch.equal(off.anchor, prox) and torch.equal(off.loss_mask.bool(), M)

    # the reference: AReaL's decoupled objective (truncated behaviour weight) on the same tensors
    settings = cfg.update
    model.train()
    logp, _ = policy_forward(model, batch, settings.logprob_chunk, temperature=cfg.rollout.temperature,
                             packed=settings.packing)
    ref = decoupled_ppo_loss(logp, prox, behav, adv, M, behav_cap=C, behav_mode="truncate",
                             clip_low=settings.clip_low, clip_high=settings.clip_high, dual_clip=settings.dual_clip,
                             agg=agg)
    params = [p for p in model.parameters() if p.requires_grad]
    grads = torch.autograd.grad(ref.loss, params)
    torch.testing.assert_close(off.is_weights, ref.behaviour.weights, atol=1e-6, rtol=0)
    r = torch.exp(logp.detach() - prox)[M]
    assert bool(((r < 1 - settings.clip_low) | (r > 1 + settings.clip_high)).any()), "no token is clipped"

    # the recipe's update: one SGD step of lr 1, so the parameters move by minus the gradient
    before = [p.detach().clone() for p in params]
    ctx = UpdateContext(device=torch.device("cpu"), bf16=False, seed=cfg.seed, updates_done=2, last_checkpoint=None,
                        temperature=cfg.rollout.temperature)
    learner = Learner(model, params, torch.optim.SGD(params, lr=1.0))
    stats = actor_update(learner, batch, scores, Advantages(adv, None), off, settings, ctx).metrics
    assert stats["loss/policy"] == pytest.approx(float(ref.loss.detach()), abs=1e-6, rel=1e-6)
    for p0, p, g in zip(before, params, grads):
        torch.testing.assert_close(p0 - p.detach(), g, atol=1e-6, rtol=1e-5)
    assert max(float(g.abs().max()) for g in grads) > 1e-3  # a gradient worth comparing


def test_without_streaming_the_anchor_is_the_trainers_and_there_are_no_weights():
    cfg = load_config(None, PLAIN)
    assert cfg.rollout.max_staleness == 0 and not cfg.rollout.overlap
    batch, scores, _, _ = _mixed(cfg, _model())
    off = off_policy(cfg, batch, scores)
    assert off.anchor is scores.old_logprobs and off.is_weights is None
    assert torch.equal(off.loss_mask, batch.loss_mask)
    assert "mismatch/kl" in off.metrics and not any(k.startswith("correction/") for k in off.metrics)


@pytest.mark.parametrize("correction", [
    ["rollout_correction.is_level=sequence", "rollout_correction.is_threshold=3"],
    ["rollout_correction.rs_level=token", "rollout_correction.rs_high=1.5"],
], ids=["sequence-is", "token-rejection"])
def test_a_correction_set_in_the_config_is_kept_under_streaming(correction):
    cfg = load_config(None, [*STREAM, *PLAIN, *correction])
    batch, scores, _, _ = _mixed(cfg, _model())
    M, prox, behav = batch.loss_mask, scores.old_logprobs, batch.old_logprobs
    off = off_policy(cfg, batch, scores)
    expected = correct(prox, behav, M, CorrectionSettings(**vars(cfg.rollout_correction)))
    assert torch.equal(off.anchor, prox)
    assert torch.equal(off.loss_mask, expected.mask)
    if expected.weights is None:  # rejection only: no token-level weights added on top
        assert off.is_weights is None and not torch.equal(off.loss_mask, M)
    else:  # sequence level: one weight per row, not the token-level default
        torch.testing.assert_close(off.is_weights, expected.weights, atol=0, rtol=0)
        token = correct(prox, behav, M, CorrectionSettings(is_level="token", is_threshold=3.0)).weights
        assert not torch.allclose(off.is_weights, token)
