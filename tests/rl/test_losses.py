"""Losses: hand-computed PPO/value/KL values, aggregation modes, chunked log-probs and entropy."""

from __future__ import annotations

import math

import pytest
import torch

from tests.rl.tensors import T, close
from vagent.rl import AGG_MODES, aggregate, entropy_from_logits, kl_penalty, logprobs_from_logits, ppo_policy_loss, value_loss
from vagent.rl.losses import explained_variance


# six tokens, old log-prob 0, ratio r = exp(logp):
#   a: A= 1, r=1.1 -> max(-1.1, -1.1)            = -1.1   (inside the trust region)
#   b: A= 1, r=1.5 -> max(-1.5, -1.2)            = -1.2   (upper clip, zero gradient)
#   c: A=-1, r=0.5 -> max( 0.5,  0.8)            =  0.8   (lower clip, zero gradient)
#   d: A=-1, r=4.0 -> max( 4.0,  1.2)            =  4.0;  dual clip c=3: min(4, 3) = 3
#   e: A=-1, r=1.0 ->                               1.0
#   f: A= 1, r=0.5 -> max(-0.5, -0.8)            = -0.5   (below 1-eps with A>0: not clipped)
RATIOS = [1.1, 1.5, 0.5, 4.0, 1.0, 0.5]
ADV = T([[1.0, 1.0, -1.0, -1.0, -1.0, 1.0]])


def _logp():
    return torch.log(T([RATIOS])).requires_grad_(True)


def test_ppo_clip_branches_by_hand():
    lp = _logp()
    out = ppo_policy_loss(lp, torch.zeros(1, 6), ADV, torch.ones(1, 6))
    close(out.loss, (-1.1 - 1.2 + 0.8 + 4.0 + 1.0 - 0.5) / 6)  # = 0.5
    close(out.clip_frac, 2 / 6)  # b (upper), c (lower)
    close(out.clip_frac_upper, 1 / 6)
    close(out.clip_frac_lower, 1 / 6)
    close(out.dual_clip_frac, 0.0)
    close(out.ratio_mean, sum(RATIOS) / 6)
    close(out.ratio_max, 4.0)
    # k3 of KL(old || new): mean of (r - 1) - log r
    close(out.approx_kl, sum((r - 1) - math.log(r) for r in RATIOS) / 6)
    out.loss.backward()
    # d l / d logp = -A r where unclipped, 0 where clipped
    close(lp.grad, [[-1.1 / 6, 0, 0, 4.0 / 6, 1.0 / 6, -0.5 / 6]])


def test_ppo_dual_clip_by_hand():
    lp = _logp()
    out = ppo_policy_loss(lp, torch.zeros(1, 6), ADV, torch.ones(1, 6), dual_clip=3.0)
    close(out.loss, (-1.1 - 1.2 + 0.8 + 3.0 + 1.0 - 0.5) / 6)  # token d capped at 3|A|
    close(out.dual_clip_frac, 1 / 6)
    out.loss.backward()
    close(lp.grad[0, 3], 0.0)  # the dual-clipped token has no gradient
    with pytest.raises(ValueError, match="dual_clip"):
        ppo_policy_loss(lp, torch.zeros(1, 6), ADV, torch.ones(1, 6), dual_clip=0.5)


def test_ppo_clip_higher_by_hand():
    # DAPO clip-higher 0.2 / 0.28: token b becomes max(-1.5, -1.28) = -1.28
    out = ppo_policy_loss(_logp(), torch.zeros(1, 6), ADV, torch.ones(1, 6), 0.2, 0.28)
    close(out.loss, (-1.1 - 1.28 + 0.8 + 4.0 + 1.0 - 0.5) / 6)


def test_ppo_mask_and_bf16():
    # masking tokens c..f leaves a and b: (-1.1 - 1.2) / 2; bf16 inputs give float32 stats
    m = T([[1, 1, 0, 0, 0, 0]])
    out = ppo_policy_loss(_logp().bfloat16(), torch.zeros(1, 6).bfloat16(), ADV.bfloat16(), m)
    assert out.loss.dtype == torch.float32
    close(out.loss, (-1.1 - 1.2) / 2, tol=1e-2)
    metrics = out.metrics()
    assert set(metrics) >= {"loss/policy", "loss/clip_frac", "loss/approx_kl"}
    assert all(isinstance(v, float) for v in metrics.values())


def test_aggregate_modes_by_hand():
    loss = T([[1.0, 2.0, 3.0], [4.0, float("nan"), 9.0], [7.0, 7.0, 7.0]])
    m = T([[1, 1, 1], [1, 0, 0], [0, 0, 0]])  # the last row is all padding
    close(aggregate(loss, m, "token-mean"), (1 + 2 + 3 + 4) / 4)  # 2.5
    close(aggregate(loss, m, "seq-mean-token-sum"), (6 + 4) / 2)  # 5.0
    close(aggregate(loss, m, "seq-mean-token-mean"), (2 + 4) / 2)  # 3.0
    with pytest.raises(ValueError, match="seq-mean-token-sum"):
        aggregate(loss, m, "sum")
    close(aggregate(loss, torch.zeros(3, 3), "token-mean"), 0.0)


def test_ppo_agg_changes_the_loss():
    # two sequences of 1 and 3 tokens, unclipped ratio 1: loss = -A
    lp = torch.zeros(2, 3, requires_grad=True)
    adv = T([[1.0, 0, 0], [2.0, 2.0, 2.0]])
    m = T([[1, 0, 0], [1, 1, 1]])
    got = {
        agg: float(ppo_policy_loss(lp, torch.zeros(2, 3), adv, m, agg=agg).loss.detach())
        for agg in AGG_MODES
    }
    close(got["token-mean"], -(1 + 6) / 4)
    close(got["seq-mean-token-sum"], -(1 + 6) / 2)
    close(got["seq-mean-token-mean"], -(1 + 2) / 2)


def test_value_loss_by_hand():
    # token 0: V=1, V_old=0.5, R=0: (V-R)^2 = 1; V_clip = 0.7, 0.49 -> 0.5 * 1 = 0.5 (unclipped)
    # token 1: V=0, V_old=1,  R=0: (V-R)^2 = 0; V_clip = 0.8, 0.64 -> 0.5 * 0.64 = 0.32 (clipped)
    v = T([[1.0, 0.0, 5.0]]).requires_grad_(True)
    out = value_loss(v, T([[0.5, 1.0, 0.0]]), T([[0.0, 0.0, 0.0]]), T([[1, 1, 0]]), clip=0.2)
    close(out.loss, (0.5 + 0.32) / 2)
    close(out.clip_frac, 0.5)
    close(out.value_mean, 0.5)
    out.loss.backward()
    close(v.grad, [[(1.0 - 0.0) / 2, 0.0, 0.0]])  # clipped token and masked token: no gradient
    out = value_loss(v, T([[0.5, 1.0, 0.0]]), T([[0.0, 0.0, 0.0]]), T([[1, 1, 0]]), clip=None)
    close(out.loss, (0.5 + 0.0) / 2)


def test_explained_variance_by_hand():
    # R = [1, 2, 3, 4], V = [1, 2, 3, 5]: Var(R) = 1.25; R - V = [0, 0, 0, -1], Var = 0.1875
    # EV = 1 - 0.1875 / 1.25 = 0.85
    v, R = T([[1.0, 2, 3, 5, 9]]), T([[1.0, 2, 3, 4, -7]])
    mask = T([[1, 1, 1, 1, 0]]).bool()  # the last position is off the mask: not counted
    close(explained_variance(v, R, mask), 0.85)
    assert math.isnan(explained_variance(T([[1.0, 2]]), T([[3.0, 3.0]]), torch.ones(1, 2)))  # Var(R) = 0
    assert math.isnan(explained_variance(T([[1.0]]), T([[3.0]]), torch.ones(1, 1)))  # one position
    # a micro-batch's value loss has no ratio of variances: explained variance is the batch's, once
    assert "loss/explained_variance" not in value_loss(v, v, R, mask).metrics()


def test_kl_estimators_by_hand():
    # pi = 0.5, pi_ref = 0.25: log(pi/pi_ref) = ln 2
    lp, ref = T([[math.log(0.5)]]), T([[math.log(0.25)]])
    close(kl_penalty(lp, ref, "k1"), [[math.log(2)]])
    close(kl_penalty(lp, ref, "k2"), [[0.5 * math.log(2) ** 2]])
    k3 = 0.5 - 1 + math.log(2)  # (pi_ref/pi - 1) - log(pi_ref/pi)
    close(kl_penalty(lp, ref, "k3"), [[k3]])
    close(kl_penalty(lp, ref, "low_var_kl"), [[k3]])
    close(kl_penalty(T([[0.0]]), T([[-100.0]]), "k3"), [[10.0]])  # clamp like verl
    close(kl_penalty(T([[-100.0]]), T([[0.0]]), "k3"), [[10.0]])
    with pytest.raises(ValueError, match="k1"):
        kl_penalty(lp, ref, "kl")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunked_logprobs_and_entropy_match_naive(dtype):
    g = torch.Generator().manual_seed(0)
    full = (3 * torch.randn(3, 12, 50, generator=g)).to(dtype).requires_grad_(True)
    logits = full[:, :-1]  # non-contiguous slice, as a model's shifted logits
    labels = torch.randint(0, 50, (3, 11), generator=g)
    lp = logprobs_from_logits(logits, labels, chunk_size=4)  # pieces of rows
    ent = entropy_from_logits(logits, chunk_size=25)  # two whole rows per chunk
    logsm = torch.log_softmax(logits.float(), -1)
    lp_ref = logsm.gather(-1, labels[..., None])[..., 0]
    ent_ref = -(logsm.exp() * logsm).sum(-1)
    assert lp.dtype == torch.float32 and lp.shape == (3, 11) and ent.shape == (3, 11)
    close(lp, lp_ref, 1e-5)
    close(ent, ent_ref, 1e-5)
    w1, w2 = torch.randn(3, 11, generator=g), torch.randn(3, 11, generator=g)
    (g_fast,) = torch.autograd.grad((lp * w1).sum() + (ent * w2).sum(), full)
    (g_ref,) = torch.autograd.grad((lp_ref * w1).sum() + (ent_ref * w2).sum(), full)
    assert g_fast.dtype == dtype
    close(g_fast, g_ref, 1e-5 if dtype == torch.float32 else 2e-2)


def test_chunked_logprobs_flat_input_and_no_grad():
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(7, 9, generator=g), torch.randint(0, 9, (7,), generator=g)
    with torch.no_grad():
        lp = logprobs_from_logits(x, y, chunk_size=3)
        ent = entropy_from_logits(x, chunk_size=100)
    close(lp, torch.log_softmax(x, -1)[torch.arange(7), y])
    close(ent, torch.distributions.Categorical(logits=x).entropy())
    with pytest.raises(ValueError, match="chunk_size"):
        logprobs_from_logits(x, y, chunk_size=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_chunked_logprobs_cuda_bf16():
    x = torch.randn(2, 9, 40, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    y = torch.randint(0, 40, (2, 9), device="cuda")
    lp = logprobs_from_logits(x, y, chunk_size=4)
    ref = torch.log_softmax(x.float(), -1).gather(-1, y[..., None])[..., 0]
    close(lp.cpu(), ref.detach().cpu(), 1e-5)
    lp.sum().backward()
    assert x.grad is not None and x.grad.dtype == torch.bfloat16
