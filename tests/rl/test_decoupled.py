"""Decoupled PPO on mixed-version batches (``vagent.rl.decoupled``) against values derived by hand,
AReaL's decoupled objective, verl's token-level truncated IS and vagent's own PPO loss.

The hand-built batch: 2 rows x 4 positions, trainer (proximal) version 5. Row 0 is a trajectory
that switched weights mid-way: positions 1-2 sampled by version 3, position 3 by version 4
(position 0 is a prompt token). Row 1 was sampled by version 5 itself at positions 0-1 (so its
behaviour log-probs equal the proximal ones), positions 2-3 are padding. Per sampled token
(probabilities, so every ratio is a round number):

    token  p_behav  p_prox  p_now   w = prox/behav   r = now/prox   A
    (0,1)   0.25     0.5     0.75       2.0             1.5        +1    r > 1.2: clipped, l = -1.2
    (0,2)   0.05     0.3     0.27       6.0             0.9        +1    l = -0.9
    (0,3)   0.5      0.4     0.2        0.8             0.5        -2    r < 0.8: clipped, l = 1.6
    (1,0)   0.5      0.5     0.75       1.0             1.5        -1    A < 0, r > 1.2: l = 1.5 (unclipped)
    (1,1)   0.2      0.2     0.2        1.0             1.0        +0.5  l = -0.5

with l = max(-A r, -A clip(r, 0.8, 1.2)). With cap C = 5 only (0,2) exceeds it.
"""

from __future__ import annotations

import math

import pytest
import torch

from tests.rl.tensors import T, close
from vagent.rl.correction import SAFETY_BOUND, CorrectionSettings, correct
from vagent.rl.decoupled import behaviour_weights, decoupled_ppo_loss, staleness_metrics
from vagent.rl.losses import AGG_MODES, aggregate, ppo_policy_loss

PAD = 0.7  # an arbitrary probability at positions off the mask
BEHAV = T([[PAD, 0.25, 0.05, 0.5], [0.5, 0.2, PAD, PAD]]).log()
PROX = T([[PAD, 0.5, 0.3, 0.4], [0.5, 0.2, PAD, PAD]]).log()
NOW = T([[PAD, 0.75, 0.27, 0.2], [0.75, 0.2, PAD, PAD]]).log()
ADV = T([[0.0, 1.0, 1.0, -2.0], [-1.0, 0.5, 0.0, 0.0]])
MASK = torch.tensor([[0, 1, 1, 1], [1, 1, 0, 0]], dtype=torch.bool)
VERSIONS = torch.tensor([[-1, 3, 3, 4], [5, 5, -1, -1]])
TRAINER_VERSION = 5
# per-token weighted losses l * w (row-major over the 5 sampled tokens) under each cap mode
L = [-1.2, -0.9, 1.6, 1.5, -0.5]
W_MASK = [2.0, 0.0, 0.8, 1.0, 1.0]  # AReaL: 6 > 5 -> 0
W_TRUNC = [2.0, 5.0, 0.8, 1.0, 1.0]  # verl: min(6, 5)


def weighted(w):
    return [li * wi for li, wi in zip(L, w)]


def loss_of(mode, agg="token-mean", cap=5.0, now=NOW):
    return decoupled_ppo_loss(now, PROX, BEHAV, ADV, MASK, behav_cap=cap, behav_mode=mode, agg=agg)


# ---------------------------------------------------------------------------------------------- by hand


def test_hand_derived_loss_in_each_mode_and_aggregation():
    # AReaL masking: (-2.4 + 0 + 1.28 + 1.5 - 0.5) / 5 tokens; the masked token still counts in the 5
    assert sum(weighted(W_MASK)) == pytest.approx(-0.12)
    close(loss_of("mask").loss, -0.12 / 5, 1e-6)
    # verl truncation: the capped token keeps weight 5: -0.12 - 4.5
    close(loss_of("truncate").loss, -4.62 / 5, 1e-6)
    close(loss_of("mask", cap=None).loss, (-0.12 - 5.4) / 5, 1e-6)  # uncapped: w = 6
    # row sums: row 0 = -2.4 + 0 + 1.28 = -1.12 over 3 tokens, row 1 = 1.5 - 0.5 = 1.0 over 2
    close(loss_of("mask", "seq-mean-token-sum").loss, (-1.12 + 1.0) / 2, 1e-6)
    close(loss_of("mask", "seq-mean-token-mean").loss, (-1.12 / 3 + 1.0 / 2) / 2, 1e-6)


def test_hand_derived_behaviour_statistics():
    out = loss_of("mask")
    raw = [2.0, 6.0, 0.8, 1.0, 1.0]
    m = out.metrics()
    assert m["loss/behav_weight_mean"] == pytest.approx(sum(raw) / 5, abs=1e-6)
    assert m["loss/behav_weight_max"] == pytest.approx(6.0, abs=1e-5)
    assert m["loss/behav_capped_frac"] == pytest.approx(1 / 5)
    assert m["loss/behav_kl"] == pytest.approx(sum(w - 1 - math.log(w) for w in raw) / 5, abs=1e-6)
    assert m["loss/clip_frac"] == pytest.approx(2 / 5)  # (0,1) upper and (0,3) lower; (1,0) is unclipped
    assert m["loss/policy"] == pytest.approx(-0.12 / 5, abs=1e-6)
    close(out.behaviour.weights, T([[0, 2.0, 0.0, 0.8], [1.0, 1.0, 0, 0]]), 1e-6)
    assert out.behaviour.capped.tolist() == [[False, False, True, False], [False, False, False, False]]
    trunc = loss_of("truncate").behaviour
    close(trunc.weights, T([[0, 2.0, 5.0, 0.8], [1.0, 1.0, 0, 0]]), 1e-6)
    assert torch.equal(trunc.capped, out.behaviour.capped)


# ---------------------------------------------------------------------------------------------- (a) AReaL


def areal_decoupled(logp, prox, behav, adv, mask, eps, eps_high, cap):
    """AReaL's ``ppo_actor_loss_fn`` with the decoupled loss on (``areal/utils/functional.py``:
    ``proximal_logprobs`` recomputed by the trainer, ``old_logprobs`` from the inference engine,
    ``behav_imp_weight_cap``), written out from its formulas: the PPO ratio against the proximal
    policy, ``pi_prox / pi_behav`` as a factor on each token's loss, set to 0 where it exceeds
    the cap, and a sum over the loss mask divided by the loss mask's token count."""
    count = mask.sum()
    ratio = torch.where(mask, torch.exp(logp - prox), 0.0)
    pg = torch.max(-adv * ratio, -adv * ratio.clamp(1 - eps, 1 + eps_high))
    w = torch.exp(prox - behav)
    w = torch.where((w <= cap) & mask, w, 0.0)
    return torch.where(mask, pg * w, 0.0).sum() / count


def mixed_version_batch(seed, B=6, L=24, trainer_version=7):
    """Random right-padded rows whose sampled tokens come from versions that rise along the row (the
    trajectory switched weights at random points); behaviour log-probs drift further from the
    proximal ones the older their version is."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(4, L + 1, (B,), generator=g)
    mask = (torch.arange(L)[None] < lengths[:, None]) & (torch.rand(B, L, generator=g) < 0.8)
    start = torch.randint(trainer_version - 4, trainer_version + 1, (B, 1), generator=g)
    steps = (torch.rand(B, L, generator=g) < 0.1).long().cumsum(-1)
    versions = torch.minimum(start + steps, torch.tensor(trainer_version))
    prox = -torch.rand(B, L, generator=g) * 3
    lag = (trainer_version - versions).float()
    behav = prox + torch.randn(B, L, generator=g) * 0.4 * lag
    logp = prox + torch.randn(B, L, generator=g) * 0.3
    adv = torch.randn(B, L, generator=g)
    return logp, prox, behav, adv, mask, versions


def test_equals_areal_decoupled_objective_by_hand_and_on_random_mixed_batches():
    want = areal_decoupled(NOW, PROX, BEHAV, ADV, MASK, 0.2, 0.2, 5.0)
    close(want, -0.12 / 5, 1e-6)  # the reference agrees with the hand derivation
    close(loss_of("mask").loss, want, 1e-7)
    for seed in range(50):
        logp, prox, behav, adv, mask, _ = mixed_version_batch(seed)
        for eps, eps_high, cap in ((0.2, 0.2, 5.0), (0.2, 0.28, 2.0), (0.1, 0.3, 1.5)):
            got = decoupled_ppo_loss(logp, prox, behav, adv, mask, behav_cap=cap, behav_mode="mask",
                                     clip_low=eps, clip_high=eps_high)
            close(got.loss, areal_decoupled(logp, prox, behav, adv, mask, eps, eps_high, cap), 1e-6)


def test_mask_mode_keeps_the_capped_token_in_the_denominator():
    # AReaL divides by the loss mask's count before the cap; verl's rejection (correction rs_level
    # token) removes the token from the count instead: the two differ by that count
    got = loss_of("mask").loss
    rejected = correct(PROX, BEHAV, MASK, CorrectionSettings(rs_level="token", rs_high=5.0, rs_low=1e-9)).mask
    assert rejected.sum() == 4
    raw = torch.exp(PROX - BEHAV) * MASK
    other = ppo_policy_loss(NOW, PROX, ADV, rejected, weights=raw).loss
    close(got * 5 / 4, other, 1e-6)


# ---------------------------------------------------------------------------------------------- (b) verl


def verl_token_tis(logp, prox, behav, adv, mask, eps, eps_high, threshold, agg):
    """verl's policy loss with rollout correction ``rollout_is: token``
    (``verl/trainer/ppo/rollout_corr_helper.py``: ``old_log_prob`` the trainer's recomputation,
    ``rollout_log_prob`` the engine's), written out from its formulas: the weight is the exp of the
    log-ratio clamped to +-20, zeroed off the mask, truncated at the threshold, detached, and
    multiplies the per-token PPO loss before the aggregation."""
    w = torch.exp((prox - behav).clamp(-SAFETY_BOUND, SAFETY_BOUND)) * mask
    w = w.clamp(max=threshold).detach()
    ratio = torch.exp(logp - prox)
    pg = torch.max(-adv * ratio, -adv * ratio.clamp(1 - eps, 1 + eps_high))
    return aggregate(pg * w, mask, agg)


def test_truncate_mode_equals_verl_token_tis_and_vagent_correction():
    close(verl_token_tis(NOW, PROX, BEHAV, ADV, MASK, 0.2, 0.2, 5.0, "token-mean"), -4.62 / 5, 1e-6)
    for seed in range(50):
        logp, prox, behav, adv, mask, _ = mixed_version_batch(seed)
        for agg in AGG_MODES:
            got = decoupled_ppo_loss(logp, prox, behav, adv, mask, behav_cap=2.0, behav_mode="truncate",
                                     clip_high=0.28, agg=agg)
            close(got.loss, verl_token_tis(logp, prox, behav, adv, mask, 0.2, 0.28, 2.0, agg), 1e-6)
            # the same weights as vagent.rl.correction's token TIS (checked against verl's own code
            # by scripts/check_correction_against_verl.py), and the same loss bit for bit
            fix = correct(prox, behav, mask, CorrectionSettings(is_level="token", is_threshold=2.0))
            assert torch.equal(got.behaviour.weights, fix.weights)
            same = ppo_policy_loss(logp, prox, adv, mask, clip_high=0.28, agg=agg, weights=fix.weights)
            assert torch.equal(got.loss, same.loss)


# ---------------------------------------------------------------------------------------------- (c) PPO


@pytest.mark.parametrize("agg", AGG_MODES)
@pytest.mark.parametrize("mode", ["mask", "truncate"])
def test_reduces_to_ppo_bit_for_bit_when_behaviour_is_proximal(agg, mode):
    for seed in range(20):
        logp, prox, _, adv, mask, _ = mixed_version_batch(seed)
        a = logp.clone().requires_grad_()
        b = logp.clone().requires_grad_()
        got = decoupled_ppo_loss(a, prox, prox.clone(), adv, mask, behav_mode=mode, clip_high=0.28, dual_clip=3.0,
                                 agg=agg)
        want = ppo_policy_loss(b, prox, adv, mask, clip_high=0.28, dual_clip=3.0, agg=agg)
        for x, y in zip(got.policy, want):
            assert torch.equal(x, y)
        got.loss.backward()
        want.loss.backward()
        assert torch.equal(a.grad, b.grad)
        assert got.behaviour.capped_frac == 0 and got.behaviour.kl == 0


# ---------------------------------------------------------------------------------------------- (d) gradient


def test_gradient_flows_only_through_current_logprobs():
    now, prox, behav, adv = (x.clone().requires_grad_() for x in (NOW, PROX, BEHAV, ADV))
    out = decoupled_ppo_loss(now, prox, behav, adv, MASK, behav_cap=5.0, behav_mode="mask")
    grads = torch.autograd.grad(out.loss, [now, prox, behav, adv], allow_unused=True)
    assert grads[1] is None and grads[2] is None and grads[3] is None
    # d loss / d logp_t = -A_t r_t w_t / 5 on unclipped tokens: (0,2) has w = 0 (masked); (0,1) and
    # (0,3) are clipped; (1,0): 1 * 1.5 * 1 / 5 = 0.3; (1,1): -0.5 * 1 * 1 / 5 = -0.1
    close(grads[0], T([[0, 0, 0, 0], [0.3, -0.1, 0, 0]]), 1e-6)
    now2 = NOW.clone().requires_grad_()
    (g,) = torch.autograd.grad(decoupled_ppo_loss(now2, PROX, BEHAV, ADV, MASK, behav_mode="truncate").loss, [now2])
    close(g, T([[0, 0, -0.9, 0], [0.3, -0.1, 0, 0]]), 1e-6)  # (0,2): -1 * 0.9 * 5 / 5


# ---------------------------------------------------------------------------------------------- edges


def test_padding_values_do_not_leak():
    junk_prox, junk_behav = PROX.clone(), BEHAV.clone()
    junk_prox[~MASK] = float("nan")
    junk_behav[~MASK] = float("-inf")
    out = decoupled_ppo_loss(NOW, junk_prox, junk_behav, ADV, MASK, behav_mode="mask")
    close(out.loss, -0.12 / 5, 1e-6)
    assert torch.isfinite(torch.stack(list(out.behaviour)[2:])).all()


def test_empty_mask_gives_zero_loss_and_statistics():
    none = torch.zeros_like(MASK)
    out = decoupled_ppo_loss(NOW.clone().requires_grad_(), PROX, BEHAV, ADV, none)
    assert out.loss == 0 and out.behaviour.weight_max == 0 and out.behaviour.capped_frac == 0
    out.loss.backward()


@pytest.mark.parametrize("kwargs, words", [
    ({"behav_mode": "clip"}, "behav_mode must be one of"),
    ({"behav_cap": 0.5}, "behav_cap must be a finite number >= 1"),
    ({"behav_cap": float("inf")}, "behav_cap must be a finite number >= 1"),
])
def test_bad_settings_are_one_line_errors(kwargs, words):
    with pytest.raises(ValueError, match=words) as e:
        decoupled_ppo_loss(NOW, PROX, BEHAV, ADV, MASK, **kwargs)
    assert "\n" not in str(e.value)


def test_behaviour_weights_alone_match_the_loss_weights():
    w = behaviour_weights(PROX, BEHAV, MASK, cap=5.0, mode="truncate")
    assert torch.equal(w.weights, loss_of("truncate").behaviour.weights)


# ---------------------------------------------------------------------------------------------- staleness


def test_staleness_metrics_by_hand():
    m = staleness_metrics(VERSIONS, MASK, TRAINER_VERSION)
    # staleness of the 5 sampled tokens: 2, 2, 1 (row 0), 0, 0 (row 1)
    assert m == {"rollout/staleness_min": 0.0, "rollout/staleness_mean": 1.0, "rollout/staleness_max": 2.0,
                 "rollout/multi_version_frac": 0.5}  # row 0 spans versions 3 and 4, row 1 only 5
    # per-turn rows of one trajectory: the two rows are one trajectory spanning 3, 4 and 5
    one = staleness_metrics(VERSIONS, MASK, TRAINER_VERSION, traj_ids=torch.tensor([7, 7]))
    assert one["rollout/multi_version_frac"] == 1.0 and one["rollout/staleness_mean"] == 1.0
    # a trajectory's unsampled positions do not count: row 0's prompt token carries -1
    assert staleness_metrics(VERSIONS, MASK, 6)["rollout/staleness_min"] == 1.0


def test_staleness_of_a_single_version_batch_and_of_an_empty_one():
    same = torch.full_like(VERSIONS, 4)
    m = staleness_metrics(same, MASK, 5)
    assert (m["rollout/staleness_min"], m["rollout/staleness_max"], m["rollout/multi_version_frac"]) == (1.0, 1.0, 0.0)
    empty = staleness_metrics(VERSIONS, torch.zeros_like(MASK), 5)
    assert all(math.isnan(v) for v in empty.values()) and len(empty) == 4


def test_staleness_rows_without_tokens_are_not_trajectories():
    mask = torch.tensor([[0, 1, 1, 1], [0, 0, 0, 0]], dtype=torch.bool)
    assert staleness_metrics(VERSIONS, mask, 5)["rollout/multi_version_frac"] == 1.0


@pytest.mark.parametrize("versions, trainer, words", [
    ([[-1, -1, 3, 4], [5, 5, -1, -1]], 5, "row 0 position 1 has no weights version"),
    ([[-1, 3, 3, 4], [5, 6, -1, -1]], 5, "row 1 position 1 has a weights version newer than the trainer's"),
])
def test_staleness_refuses_tokens_without_a_sane_version(versions, trainer, words):
    with pytest.raises(ValueError, match=words) as e:
        staleness_metrics(torch.tensor(versions), MASK, trainer)
    assert "\n" not in str(e.value)


def test_staleness_shape_errors():
    with pytest.raises(ValueError, match=r"versions and mask must both be \[B, L\]"):
        staleness_metrics(VERSIONS[:, :3], MASK, 5)
    with pytest.raises(ValueError, match=r"traj_ids must be \[B\] = \[2\]"):
        staleness_metrics(VERSIONS, MASK, 5, traj_ids=torch.tensor([1, 2, 3]))
