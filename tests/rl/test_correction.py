"""Mismatch metrics and rollout corrections (``vagent.rl.correction``) against values derived by hand.

The batch: 2 rows x 4 positions, sampled tokens at positions 1-3 of row 0 and 1-2 of row 1, so the
log-ratios lr = trainer - engine on the mask are row 0: (0.2, 0.0, -1.0), row 1: (-0.1, 0.0).
The semantics are verl's ``verl/trainer/ppo/rollout_corr_helper.py`` (token / sequence truncated IS,
token / sequence / geometric rejection, the per-token veto, ``k3_kl`` and ``ppl_ratio`` of
``compute_offpolicy_metrics``): each expected value below is written the way that file computes it.
"""

from __future__ import annotations

import math

import pytest
import torch

from vagent.rl.correction import CorrectionSettings, correct, k3_kl, mismatch_metrics
from vagent.rl.losses import aggregate, ppo_policy_loss

TRAINER = torch.tensor([[0.0, -1.0, -0.5, -2.0], [0.0, -0.2, -0.3, 0.0]])
ENGINE = torch.tensor([[0.0, -1.2, -0.5, -1.0], [0.0, -0.1, -0.3, 0.0]])
MASK = torch.tensor([[0, 1, 1, 1], [0, 1, 1, 0]], dtype=torch.bool)
LR = [0.2, 0.0, -1.0, -0.1, 0.0]  # the masked log-ratios, row-major


def k3(x: float) -> float:
    return math.exp(x) - 1.0 - x


def test_mismatch_metrics_by_hand():
    m = mismatch_metrics(TRAINER, ENGINE, MASK)
    assert m["mismatch/kl"] == pytest.approx(sum(k3(x) for x in LR) / 5, abs=1e-7)
    assert m["mismatch/kl"] == pytest.approx(0.07882392, abs=1e-7)
    assert m["mismatch/abs_logprob_diff_mean"] == pytest.approx(1.3 / 5, abs=1e-7)
    assert m["mismatch/abs_logprob_diff_max"] == pytest.approx(1.0, abs=1e-7)
    # per row: ppl_trainer / ppl_engine = exp(mean engine - mean trainer), then the row mean
    row0 = math.exp((-1.2 - 0.5 - 1.0) / 3 - (-1.0 - 0.5 - 2.0) / 3)
    row1 = math.exp((-0.1 - 0.3) / 2 - (-0.2 - 0.3) / 2)
    assert m["mismatch/ppl_ratio"] == pytest.approx((row0 + row1) / 2, abs=1e-6)
    assert set(m) == {"mismatch/kl", "mismatch/abs_logprob_diff_mean", "mismatch/abs_logprob_diff_max",
                      "mismatch/ppl_ratio"}


def test_mismatch_split_by_image_in_context():
    # row 0 saw an image before its position 2: its tokens at 2 and 3 are "image", the rest "text"
    image = torch.tensor([[0, 0, 1, 1], [0, 0, 0, 0]], dtype=torch.bool)
    m = mismatch_metrics(TRAINER, ENGINE, MASK, image)
    assert m["mismatch/kl_image"] == pytest.approx((k3(0.0) + k3(-1.0)) / 2, abs=1e-7)
    assert m["mismatch/kl_text"] == pytest.approx((k3(0.2) + k3(-0.1) + k3(0.0)) / 3, abs=1e-7)
    assert m["mismatch/abs_logprob_diff_max_image"] == pytest.approx(1.0, abs=1e-7)
    assert m["mismatch/abs_logprob_diff_max_text"] == pytest.approx(0.2, abs=1e-6)
    # nothing with an image in context: that split is left out, never a fake 0
    m = mismatch_metrics(TRAINER, ENGINE, MASK, torch.zeros_like(image))
    assert "mismatch/kl_image" not in m and m["mismatch/kl_text"] == pytest.approx(m["mismatch/kl"])


def test_k3_is_zero_for_equal_logprobs_and_ignores_padding():
    junk = TRAINER.clone()
    junk[0, 0] = float("nan")  # off the mask
    assert k3_kl(junk, junk, MASK) == 0.0


def test_token_tis_truncates_each_token_at_c():
    fix = correct(TRAINER, ENGINE, MASK, CorrectionSettings(is_level="token", is_threshold=1.1))
    w = fix.weights
    assert w[0, 1] == pytest.approx(1.1)  # exp(0.2) = 1.2214 > C
    assert w[0, 2] == pytest.approx(1.0) and w[0, 3] == pytest.approx(math.exp(-1.0), abs=1e-6)
    assert w[1, 1] == pytest.approx(math.exp(-0.1), abs=1e-6) and w[1, 2] == pytest.approx(1.0)
    assert w[0, 0] == 0 and w[1, 3] == 0  # off the mask
    assert torch.equal(fix.mask, MASK)
    raw = [math.exp(x) for x in LR]
    assert fix.metrics["correction/is_mean"] == pytest.approx(sum(raw) / 5, abs=1e-6)
    assert fix.metrics["correction/is_max"] == pytest.approx(math.exp(0.2), abs=1e-6)
    assert fix.metrics["correction/is_truncated_frac"] == pytest.approx(1 / 5)
    cut = [min(r, 1.1) for r in raw]
    mean = sum(cut) / 5
    assert fix.metrics["correction/is_ess"] == pytest.approx(1 / (sum((c / mean) ** 2 for c in cut) / 5), abs=1e-6)


def test_sequence_tis_uses_the_product_over_the_row():
    fix = correct(TRAINER, ENGINE, MASK, CorrectionSettings(is_level="sequence", is_threshold=2.0))
    assert torch.allclose(fix.weights[0, 1:], torch.full((3,), math.exp(-0.8)), atol=1e-6)
    assert torch.allclose(fix.weights[1, 1:3], torch.full((2,), math.exp(-0.1)), atol=1e-6)
    low = correct(TRAINER, ENGINE, MASK, CorrectionSettings(is_level="sequence", is_threshold=0.5))
    assert torch.allclose(low.weights[1, 1:3], torch.full((2,), 0.5))  # exp(-0.1) = 0.905 truncated at 0.5


def test_token_rejection_drops_tokens_outside_the_band():
    fix = correct(TRAINER, ENGINE, MASK, CorrectionSettings(rs_level="token", rs_low=0.5, rs_high=2.0))
    assert fix.weights is None
    expected = MASK.clone()
    expected[0, 3] = False  # rho = exp(-1) = 0.368 < 0.5
    assert torch.equal(fix.mask, expected)
    assert fix.metrics["correction/rejected_token_frac"] == pytest.approx(1 / 5)
    assert fix.metrics["correction/rejected_row_frac"] == pytest.approx(1 / 2)


def test_geometric_rejection_and_default_lower_bound():
    # geometric mean ratio: row 0 exp(-0.8 / 3) = 0.766, row 1 exp(-0.05) = 0.951; band [1/1.1, 1.1]
    fix = correct(TRAINER, ENGINE, MASK, CorrectionSettings(rs_level="geometric", rs_high=1.1))
    assert not fix.mask[0].any() and torch.equal(fix.mask[1], MASK[1])
    # sequence: row 0 exp(-0.8) = 0.449 < 1/2; row 1 exp(-0.1) kept
    fix = correct(TRAINER, ENGINE, MASK, CorrectionSettings(rs_level="sequence", rs_high=2.0))
    assert not fix.mask[0].any() and torch.equal(fix.mask[1], MASK[1])
    assert fix.metrics["correction/rejected_token_frac"] == pytest.approx(3 / 5)


def test_veto_rejects_the_whole_row_of_a_catastrophic_token():
    fix = correct(TRAINER, ENGINE, MASK, CorrectionSettings(is_level="token", is_threshold=2.0, veto_threshold=0.5))
    assert not fix.mask[0].any() and torch.equal(fix.mask[1], MASK[1])
    assert (fix.weights[0] == 0).all()  # a rejected token carries no weight either
    assert fix.metrics["correction/veto_row_frac"] == pytest.approx(0.5)


def test_ppo_loss_with_weights_is_the_weighted_token_loss():
    adv = torch.tensor([[0.0, 1.0, -1.0, 0.5], [0.0, -0.3, 2.0, 0.0]])
    logp = TRAINER + torch.tensor([[0.0, 0.1, -0.05, 0.3], [0.0, 0.0, 0.02, 0.0]])
    w = correct(TRAINER, ENGINE, MASK, CorrectionSettings(is_level="token", is_threshold=1.1)).weights
    plain = ppo_policy_loss(logp, TRAINER, adv, MASK, agg="token-mean")
    weighted = ppo_policy_loss(logp, TRAINER, adv, MASK, agg="token-mean", weights=w)
    # per token l_t = max(-A r, -A clip(r)); the weighted loss is the mean of w_t l_t over M
    r = torch.exp(logp - TRAINER)
    per_token = torch.maximum(-adv * r, -adv * r.clamp(0.8, 1.2))
    assert float(weighted.loss) == pytest.approx(float(aggregate(per_token * w, MASK, "token-mean")), abs=1e-6)
    assert float(weighted.loss) != pytest.approx(float(plain.loss), abs=1e-4)


@pytest.mark.parametrize("kwargs", [{"is_threshold": 0.0}, {"is_threshold": float("nan")}, {"rs_high": -1.0},
                                    {"rs_low": 2.0, "rs_high": 1.5}, {"veto_threshold": float("inf")},
                                    {"is_level": "row"}])
def test_bad_settings_are_refused(kwargs):
    with pytest.raises(ValueError):
        CorrectionSettings(**kwargs)
