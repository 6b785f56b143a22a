"""Advantage estimators: hand-derived values, plain-loop references, properties."""

from __future__ import annotations

import math

import pytest
import torch

from tests.rl.tensors import T, close
from vagent.rl import (
    anchor_mask,
    bi_level_gae,
    gigpo_advantages,
    grpo_advantages,
    masked_gae,
    masked_mean,
    masked_sum,
    masked_whiten,
    no_concat_gae,
    reinforce_pp_advantages,
    rloo_advantages,
    turn_gae,
)


# ----------------------------------------------------------------------------------------------
# plain per-row reference loops (float64, Python floats)
# ----------------------------------------------------------------------------------------------


def _boot(b, truncated, final_values):
    return float(final_values[b]) if truncated is not None and bool(truncated[b]) else 0.0


def ref_masked_gae(r, v, m, gamma, lam, truncated=None, final_values=None):
    B, L = r.shape
    adv, ret = torch.zeros(B, L, dtype=torch.float64), torch.zeros(B, L, dtype=torch.float64)
    for b in range(B):
        next_v, gae = _boot(b, truncated, final_values), 0.0
        for t in reversed(range(L)):
            if not m[b, t]:
                continue
            delta = float(r[b, t]) + gamma * next_v - float(v[b, t])
            gae = delta + gamma * lam * gae
            adv[b, t], ret[b, t] = gae, gae + float(v[b, t])
            next_v = float(v[b, t])
    return adv, ret


def ref_turn_level(r, v, m, e, b, gamma_turn, lam, boot, sum_turn_rewards):
    """{e_k position: A_k} for row b; r_k = r(e_k) or the sum over the turn's tokens."""
    ends, rk, acc = [], [], 0.0
    for t in range(r.shape[1]):
        if m[b, t]:
            acc += float(r[b, t]) if sum_turn_rewards or e[b, t] else 0.0
            if e[b, t]:
                ends.append(t)
                rk.append(acc)
                acc = 0.0
    out, next_v, gae = {}, boot, 0.0
    for k in reversed(range(len(ends))):
        delta = rk[k] + gamma_turn * next_v - float(v[b, ends[k]])
        gae = delta + gamma_turn * lam * gae
        out[ends[k]] = gae
        next_v = float(v[b, ends[k]])
    return out


def ref_bi_level(r, v, m, e, gamma_token, gamma_turn, lam, truncated=None, final_values=None):
    B, L = r.shape
    adv, ret = torch.zeros(B, L, dtype=torch.float64), torch.zeros(B, L, dtype=torch.float64)
    for b in range(B):
        boot = _boot(b, truncated, final_values)
        ak = ref_turn_level(r, v, m, e, b, gamma_turn, lam, boot, False)
        a_next, v_next = 0.0, 0.0
        for t in reversed(range(L)):
            if not m[b, t]:
                continue
            if e[b, t]:
                a = ak[t]  # A(e_k) = A_k
            else:
                delta = float(r[b, t]) + gamma_token * v_next - float(v[b, t])
                a = delta + gamma_token * lam * a_next
            adv[b, t], ret[b, t] = a, a + float(v[b, t])
            a_next, v_next = a, float(v[b, t])
    return adv, ret


def ref_turn_gae(r, v, m, e, gamma_turn, lam, truncated=None, final_values=None):
    B, L = r.shape
    adv, ret = torch.zeros(B, L, dtype=torch.float64), torch.zeros(B, L, dtype=torch.float64)
    for b in range(B):
        boot = _boot(b, truncated, final_values)
        ak = ref_turn_level(r, v, m, e, b, gamma_turn, lam, boot, True)
        current = None
        for t in reversed(range(L)):
            if m[b, t]:
                if e[b, t]:
                    current = ak[t]
                    ret[b, t] = current + float(v[b, t])
                adv[b, t] = current
    return adv, ret


def ref_no_concat(rk, v, m, traj, turn, gamma, lam, anchor, truncated=None, final_values=None):
    N, L = v.shape
    pos = []
    for i in range(N):
        idx = [t for t in range(L) if m[i, t]]
        pos.append(idx[0] if anchor == "first" else idx[-1])
    adv, ret = torch.zeros(N, L, dtype=torch.float64), torch.zeros(N, L, dtype=torch.float64)
    for tr in set(traj.tolist()):
        rows = sorted((int(turn[i]), i) for i in range(N) if int(traj[i]) == tr)
        next_v = _boot(rows[-1][1], truncated, final_values)
        gae = 0.0
        for _, i in reversed(rows):
            vi = float(v[i, pos[i]])
            gae = float(rk[i]) + gamma * next_v - vi + gamma * lam * gae
            adv[i][m[i]] = gae
            ret[i, pos[i]] = gae + vi
            next_v = vi
    return adv, ret


# ----------------------------------------------------------------------------------------------
# random padded multi-turn batches
# ----------------------------------------------------------------------------------------------


def make_batch(seed, B=6, L=96, dtype=torch.float32, token_rewards=True):
    """Rows: [left pad][prompt][obs][act]...[obs][act][right pad]; M=1 only on act tokens.

    Rewards on every turn end e_k (and, if token_rewards, small rewards on other act tokens);
    values random EVERYWHERE, including M=0 positions (they must not matter).
    """
    g = torch.Generator().manual_seed(seed)
    m = torch.zeros(B, L, dtype=torch.bool)
    e = torch.zeros(B, L, dtype=torch.bool)
    for b in range(B):
        t = int(torch.randint(0, 6, (), generator=g)) if b % 2 else 0  # left pad on odd rows
        t += int(torch.randint(1, 5, (), generator=g))  # system prompt
        for _ in range(int(torch.randint(1, 5, (), generator=g))):  # 1..4 turns
            t += int(torch.randint(0, 6, (), generator=g))  # observation gap (may be empty)
            n = int(torch.randint(1, 9, (), generator=g))  # action tokens
            if t + n > L:
                break
            m[b, t : t + n] = True
            e[b, t + n - 1] = True
            t += n
    r = torch.where(e, torch.randn(B, L, generator=g), 0.0)
    if token_rewards:
        r = r + torch.where(m & ~e, 0.1 * torch.randn(B, L, generator=g), 0.0)
    v = torch.randn(B, L, generator=g)
    return r.to(dtype), v.to(dtype), m, e


def truncation(B, seed):
    g = torch.Generator().manual_seed(seed + 1000)
    return torch.rand(B, generator=g) < 0.5, torch.randn(B, generator=g)


DTYPES = [torch.float32, torch.bfloat16]


# ----------------------------------------------------------------------------------------------
# hand-derived values
# ----------------------------------------------------------------------------------------------


def test_masked_gae_three_turns_reward_at_end():
    # 3 sampled tokens (one per turn) with observation gaps, gamma 0.9, lam 1, V = 0, reward 1
    # at the end -> returns 0.9^2 = 0.81, 0.9, 1.0
    m = T([[1, 0, 1, 0, 0, 1]]).bool()
    r = T([[0, 0, 0, 0, 0, 1.0]])
    adv, ret = masked_gae(r, torch.zeros(1, 6), m, gamma=0.9, lam=1.0)
    close(ret, [[0.81, 0, 0.9, 0, 0, 1.0]])
    close(adv, ret)


def test_masked_gae_with_values():
    # r = [0, 1], V = [0.5, 0.2], gamma 0.9, lam 0.8:
    # delta_1 = 1 - 0.2 = 0.8 = A_1; delta_0 = 0.9*0.2 - 0.5 = -0.32; A_0 = -0.32 + 0.72*0.8 = 0.256
    adv, ret = masked_gae(T([[0, 0, 1.0]]), T([[0.5, 9.0, 0.2]]), T([[1, 0, 1]]), 0.9, 0.8)
    close(adv, [[0.256, 0, 0.8]])
    close(ret, [[0.756, 0, 1.0]])


def test_truncated_bootstraps_terminated_does_not():
    # one token, r = 0, V = 0.5, V(next obs) = 2, gamma 0.9:
    # truncated: A = 0 + 0.9*2 - 0.5 = 1.3; terminated: A = -0.5
    r, v, m = torch.zeros(2, 1), T([[0.5], [0.5]]), torch.ones(2, 1)
    tr, fv = T([True, False], torch.bool), T([2.0, 2.0])
    for fn, args in [
        (masked_gae, (0.9, 1.0)),
        (lambda *a, **k: bi_level_gae(*a[:3], m, 1.0, *a[3:], **k), (0.9, 1.0)),
        (lambda *a, **k: turn_gae(*a[:3], m, *a[3:], **k), (0.9, 1.0)),
    ]:
        adv, _ = fn(r, v, m, *args, truncated=tr, final_values=fv)
        close(adv, [[1.3], [-0.5]])
    adv, _ = no_concat_gae(T([0.0, 0.0]), v, m, T([0, 1]), T([0, 0]), 0.9, 1.0,
                           truncated=tr, final_values=fv)
    close(adv, [[1.3], [-0.5]])


def test_bootstrap_arguments_must_come_together():
    with pytest.raises(ValueError, match="both truncated"):
        masked_gae(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), 1.0, 1.0,
                   truncated=T([True], torch.bool))


BI_M = T([[1, 1, 0, 0, 1, 1]]).bool()  # turn 1 = tokens 0,1; observation 2,3; turn 2 = 4,5
BI_E = T([[0, 1, 0, 0, 0, 1]]).bool()
BI_R = T([[0, 0.5, 0, 0, 0, 1.0]])
BI_V = T([[0.1, 0.2, 7.0, 7.0, 0.3, 0.4]])


def test_bi_level_gae_by_hand():
    # turn level (gamma_turn 0.9, lam 1): delta_2 = 1 - 0.4 = 0.6 = A_2;
    #   delta_1 = 0.5 + 0.9*0.4 - 0.2 = 0.66; A_1 = 0.66 + 0.9*0.6 = 1.2
    # token level (gamma_token 1): A(e_1) = 1.2, A(t0) = 0.2 - 0.1 + 1.2 = 1.3;
    #   A(e_2) = 0.6, A(t4) = 0.4 - 0.3 + 0.6 = 0.7
    adv, ret = bi_level_gae(BI_R, BI_V, BI_M, BI_E, gamma_token=1.0, gamma_turn=0.9, lam=1.0)
    close(adv, [[1.3, 1.2, 0, 0, 0.7, 0.6]])
    close(ret, [[1.4, 1.4, 0, 0, 1.0, 1.0]])  # A + V


def test_turn_gae_by_hand():
    # same turns: A_1 = 1.2 on both tokens of turn 1, A_2 = 0.6 on turn 2;
    # returns only at e_k: 1.2 + 0.2 = 1.4 and 0.6 + 0.4 = 1.0
    adv, ret = turn_gae(BI_R, BI_V, BI_M, BI_E, gamma_turn=0.9, lam=1.0)
    close(adv, [[1.2, 1.2, 0, 0, 0.6, 0.6]])
    close(ret, [[0, 1.4, 0, 0, 0, 1.0]])
    # a reward on a non-final token of a turn counts in that turn's reward: r_1 = 0.3 + 0.5 = 0.8
    # -> delta_1 = 0.8 + 0.36 - 0.2 = 0.96, A_1 = 0.96 + 0.54 = 1.5
    adv, _ = turn_gae(BI_R + T([[0.3, 0, 0, 0, 0, 0]]), BI_V, BI_M, BI_E, 0.9, 1.0)
    close(adv, [[1.5, 1.5, 0, 0, 0.6, 0.6]])


def test_no_concat_gae_by_hand_shuffled_rows():
    # trajectory 7: turns 0,1,2 (rows 2,0,3), reward 1 on the last turn; trajectory 3: one turn
    # (row 1), reward 2. V = 0, gamma 0.9, lam 1 -> A = 0.81, 0.9, 1.0 and 2.0
    m = T([[0, 1, 1], [1, 1, 0], [1, 0, 0], [0, 0, 1]]).bool()
    rk = T([0.0, 2.0, 0.0, 1.0])
    adv, ret = no_concat_gae(rk, torch.zeros(4, 3), m, T([7, 3, 7, 7]), T([1, 0, 0, 2]), 0.9, 1.0)
    close(adv, [[0, 0.9, 0.9], [2, 2, 0], [0.81, 0, 0], [0, 0, 1.0]])
    close(ret, [[0, 0.9, 0], [2, 0, 0], [0.81, 0, 0], [0, 0, 1.0]])  # at the first M=1 token


def test_no_concat_gae_anchor_first_vs_last():
    # two turns (rows 0, 1), reward 1 on turn 2, gamma = lam = 1
    # first-token anchor: V = [0.5, 0.1] -> A_2 = 1 - 0.1 = 0.9; A_1 = 0.1 - 0.5 + 0.9 = 0.5
    # last-token anchor:  V = [0.2, 0.3] -> A_2 = 1 - 0.3 = 0.7; A_1 = 0.3 - 0.2 + 0.7 = 0.8
    # returns A_k + V_k = 1.0 everywhere (Monte Carlo, since gamma = lam = 1)
    v = T([[0.5, 0.2], [0.1, 0.3]])
    m = torch.ones(2, 2, dtype=torch.bool)
    args = (T([0.0, 1.0]), v, m, T([0, 0]), T([0, 1]), 1.0, 1.0)
    adv, ret = no_concat_gae(*args, anchor="first")
    close(adv, [[0.5, 0.5], [0.9, 0.9]])
    close(ret, [[1.0, 0], [1.0, 0]])
    adv, ret = no_concat_gae(*args, anchor="last")
    close(adv, [[0.8, 0.8], [0.7, 0.7]])
    close(ret, [[0, 1.0], [0, 1.0]])
    close(anchor_mask(m, "last").float(), [[0, 1], [0, 1]])
    with pytest.raises(ValueError, match="anchor"):
        anchor_mask(m, "middle")


def test_no_concat_gae_token_rewards_are_summed():
    m = T([[1, 1, 0]]).bool()
    adv, _ = no_concat_gae(T([[0.25, 0.5, 0.0]]), torch.zeros(1, 3), m, T([0]), T([0]), 0.9, 1.0)
    close(adv, [[0.75, 0.75, 0]])


def test_no_concat_gae_rejects_duplicates_and_empty_rows():
    m = torch.ones(2, 2, dtype=torch.bool)
    with pytest.raises(ValueError, match="duplicate"):
        no_concat_gae(T([0.0, 1.0]), torch.zeros(2, 2), m, T([0, 0]), T([1, 1]), 1.0, 1.0)
    m[1] = False
    with pytest.raises(ValueError, match="no M=1 token"):
        no_concat_gae(T([0.0, 1.0]), torch.zeros(2, 2), m, T([0, 0]), T([0, 1]), 1.0, 1.0)


def test_grpo_by_hand():
    # group 0: [1, 0, 1, 0]: mean 0.5, unbiased std sqrt(1/3) = 0.57735 -> A = +-0.866;
    # group 5: singleton -> 0
    s = T([1.0, 0.0, 1.0, 0.0, 3.0])
    g = T([0, 0, 0, 0, 5])
    m = torch.ones(5, 2, dtype=torch.bool)
    m[1, 1] = False
    adv, ret = grpo_advantages(s, g, m)
    a = 0.5 / (math.sqrt(1 / 3) + 1e-6)
    close(adv, [[a, a], [-a, 0], [a, a], [-a, -a], [0, 0]])
    close(ret, adv)
    adv, _ = grpo_advantages(s, g, m, norm_by_std=False)
    close(adv[:, 0], [0.5, -0.5, 0.5, -0.5, 0.0])


def test_rloo_by_hand():
    # [1, 0, 0]: A_0 = 1 - (0+0)/2 = 1, A_1 = 0 - (1+0)/2 = -0.5, A_2 = -0.5; singleton -> 0
    adv, _ = rloo_advantages(T([1.0, 0.0, 0.0, 4.0]), T([2, 2, 2, 9]), torch.ones(4, 1))
    close(adv[:, 0], [1.0, -0.5, -0.5, 0.0])


def test_reinforce_pp_by_hand():
    # group means: [1, 0] -> [0.5, -0.5]; [3, 3] -> [0, 0]. Whitened over the 4 tokens:
    # mean 0, unbiased var (0.25 + 0.25) / 3 = 1/6 -> +-0.5 / sqrt(1/6) = +-1.2247
    adv, _ = reinforce_pp_advantages(T([1.0, 0.0, 3.0, 3.0]), T([0, 0, 1, 1]), torch.ones(4, 1))
    close(adv[:, 0], [1.2247449, -1.2247449, 0.0, 0.0])


def test_gigpo_by_hand():
    # one group, two trajectories, two steps each; states: traj 0 visits (s0, s1), traj 1 (s0, s2)
    # step rewards traj 0 [0, 1], traj 1 [0, 0]; gamma 0.5 -> step returns [0.5, 1] and [0, 0]
    # episode: scores [1, 0] -> +-0.5 / sqrt(0.5) = +-0.7071
    # step: anchor s0 = {0.5, 0} -> +-0.7071; s1 and s2 are singletons -> 0
    # A = traj 0: [1.4142, 0.7071], traj 1: [-1.4142, -0.7071]
    m = T([[1, 1, 0, 1], [1, 0, 1, 1]]).bool()
    tid = T([[0, 0, -1, 1], [0, -1, 1, 1]], torch.long)
    kw = dict(gamma=0.5, omega=1.0)
    args = (T([1.0, 0.0]), T([0, 0]), T([[0.0, 1.0], [0.0, 0.0]]))
    adv, ret = gigpo_advantages(*args, [["s0", "s1"], ["s0", "s2"]], m, tid, **kw)
    x = 0.5 / (math.sqrt(0.5) + 1e-6)
    close(adv, [[2 * x, 2 * x, 0, x], [-2 * x, 0, -x, -x]])
    close(ret, adv)
    adv2, _ = gigpo_advantages(*args, T([[0, 1], [0, 2]], torch.long), m, tid, **kw)
    close(adv2, adv)
    adv3, _ = gigpo_advantages(*args, [["s0", "s1"], ["s0", "s2"]], m, tid, gamma=0.5, omega=0.0)
    close(adv3, [[x, x, 0, x], [-x, 0, -x, -x]])


def test_gigpo_anchor_groups_stay_within_a_group():
    # the same state key in two different groups must not be pooled: two singleton groups
    m = torch.ones(2, 1, dtype=torch.bool)
    tid = torch.zeros(2, 1, dtype=torch.long)
    adv, _ = gigpo_advantages(T([1.0, 0.0]), T([0, 1]), T([[1.0], [0.0]]), [["s"], ["s"]], m, tid)
    close(adv, torch.zeros(2, 1))


def test_masked_reductions_and_whiten():
    x = T([[1.0, 2.0, float("nan")], [3.0, 100.0, 5.0]])
    m = T([[1, 1, 0], [1, 0, 1]]).bool()
    close(masked_sum(x, m), 11.0)
    close(masked_mean(x, m), 2.75)
    close(masked_mean(x, m, dim=1), [1.5, 4.0])
    close(masked_mean(x, torch.zeros_like(m), dim=1), [0.0, 0.0])  # empty mask -> 0
    # values 1,2,3,5: mean 2.75, unbiased var (3.0625+0.5625+0.0625+5.0625)/3 = 2.9167
    w = masked_whiten(x, m)
    s = math.sqrt(8.75 / 3)
    close(w, [[-1.75 / s, -0.75 / s, 0], [0.25 / s, 0, 2.25 / s]], tol=1e-4)
    close(masked_whiten(x, m, shift_mean=False)[0, 0], -1.75 / s + 2.75, tol=1e-4)


# ----------------------------------------------------------------------------------------------
# vectorised == plain loop on random padded batches
# ----------------------------------------------------------------------------------------------


# estimator name -> (vectorised estimator, its plain-loop reference, whether both take the turn
# ends, the (gamma..., lambda) tuples to run after the batch)
LOOP_CASES = {
    "masked_gae": (masked_gae, ref_masked_gae, False,
                   [(0.97, 0.9), (1.0, 1.0)]),  # general scan; gamma*lam = 1 suffix sums
    "bi_level_gae": (bi_level_gae, ref_bi_level, True, [(1.0, 0.95, 1.0), (0.99, 0.9, 0.95), (1.0, 1.0, 0.9)]),
    "turn_gae": (turn_gae, ref_turn_gae, True, [(0.95, 0.9)]),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("estimator", list(LOOP_CASES))
def test_gae_matches_loop(estimator, seed, dtype):
    fast, ref, takes_turn_ends, settings = LOOP_CASES[estimator]
    r, v, m, e = make_batch(seed, dtype=dtype)
    batch = (r, v, m, e) if takes_turn_ends else (r, v, m)
    tr, fv = truncation(r.shape[0], seed)
    for kw in ({}, {"truncated": tr, "final_values": fv}):
        for setting in settings:
            adv, ret = fast(*batch, *setting, **kw)
            ra, rr = ref(*batch, *setting, **kw)
            assert adv.dtype == torch.float32 and ret.dtype == torch.float32
            close(adv, ra, 1e-4)
            close(ret, rr, 1e-4)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("anchor", ["first", "last"])
def test_no_concat_gae_matches_loop(anchor, dtype):
    g = torch.Generator().manual_seed(3)
    N, L = 20, 12
    m = torch.rand(N, L, generator=g) < 0.6
    m[:, 5] = True  # every row has an anchor
    traj = torch.randint(0, 5, (N,), generator=g)
    turn = torch.randperm(N, generator=g)  # distinct, gapped, unordered turn ids
    rk, v = torch.randn(N, generator=g).to(dtype), torch.randn(N, L, generator=g).to(dtype)
    tr, fv = truncation(N, 3)
    for kw in ({}, {"truncated": tr, "final_values": fv}):
        adv, ret = no_concat_gae(rk, v, m, traj, turn, 0.9, 0.95, anchor=anchor, **kw)
        ra, rr = ref_no_concat(rk, v, m, traj, turn, 0.9, 0.95, anchor, **kw)
        close(adv, ra, 1e-4)
        close(ret, rr, 1e-4)


@pytest.mark.parametrize("seed", [0, 1])
def test_gigpo_matches_loop(seed):
    g = torch.Generator().manual_seed(seed)
    B, Tmax, L, gamma, omega = 12, 4, 10, 0.9, 0.7
    group = torch.randint(0, 3, (B,), generator=g)
    n_steps = torch.randint(1, Tmax + 1, (B,), generator=g)
    keys = [[int(k) for k in torch.randint(0, 3, (int(n),), generator=g)] for n in n_steps]
    sr = torch.randn(B, Tmax, generator=g) * (torch.arange(Tmax) < n_steps[:, None])
    scores = torch.randn(B, generator=g)
    tid = torch.randint(0, Tmax, (B, L), generator=g) % n_steps[:, None]
    m = torch.rand(B, L, generator=g) < 0.7
    adv, _ = gigpo_advantages(scores, group, sr, keys, m, tid, gamma=gamma, omega=omega)

    def normalize(vals):  # unbiased std, singleton -> 0
        if len(vals) == 1:
            return [0.0]
        mu = sum(vals) / len(vals)
        sd = math.sqrt(sum((x - mu) ** 2 for x in vals) / (len(vals) - 1))
        return [(x - mu) / (sd + 1e-6) for x in vals]

    a_ep, a_st, buckets = {}, {}, {}
    for grp in set(group.tolist()):
        idx = [i for i in range(B) if int(group[i]) == grp]
        a_ep.update(zip(idx, normalize([float(scores[i]) for i in idx])))
    for i in range(B):
        for t in range(int(n_steps[i])):
            ret = sum(gamma ** (k - t) * float(sr[i, k]) for k in range(t, int(n_steps[i])))
            buckets.setdefault((int(group[i]), keys[i][t]), []).append(((i, t), ret))
    for items in buckets.values():
        a_st.update(zip([it for it, _ in items], normalize([x for _, x in items])))
    ref = torch.zeros(B, L)
    for i in range(B):
        for t in range(L):
            if m[i, t]:
                ref[i, t] = a_ep[i] + omega * a_st[(i, int(tid[i, t]))]
    close(adv, ref, 1e-4)


# ----------------------------------------------------------------------------------------------
# properties
# ----------------------------------------------------------------------------------------------


def _all_concat(r, v, m, e, **kw):
    return {
        "masked": masked_gae(r, v, m, 0.97, 0.9, **kw),
        "bi_level": bi_level_gae(r, v, m, e, 1.0, 0.9, 0.95, **kw),
        "turn": turn_gae(r, v, m, e, 0.9, 0.95, **kw),
    }


def test_masked_positions_are_zero_and_m0_values_do_not_matter():
    r, v, m, e = make_batch(5)
    out = _all_concat(r, v, m, e)
    v2 = torch.where(m, v, 1000.0 * torch.randn_like(v))  # change values on obs/padding tokens
    out2 = _all_concat(r, v2, m, e)
    for k, (adv, ret) in out.items():
        assert (adv[~m] == 0).all() and (ret[~m] == 0).all(), k
        close(out2[k][0], adv)
        close(out2[k][1], ret)
    assert (out["turn"][1][~e] == 0).all()  # turn_gae returns only at e_k


def test_observation_tokens_and_padding_change_nothing():
    # dropping every M=0 column (observations, prompts, padding) gives the same values on M=1
    r, v, m, e = make_batch(6, B=1, L=80)
    keep = m[0]
    out = _all_concat(r, v, m, e)
    out_c = _all_concat(r[:, keep], v[:, keep], m[:, keep], e[:, keep])
    for k in out:
        close(out[k][0][:, keep], out_c[k][0])
        close(out[k][1][:, keep], out_c[k][1])


def test_reward_on_unmasked_token_is_an_error():
    r, v, m, e = make_batch(7)
    r = r.clone()
    r[~m] = 0.0
    b, t = (int(i) for i in (~m).nonzero()[3])
    r[b, t] = 1.0
    for fn in (
        lambda: masked_gae(r, v, m, 1.0, 1.0),
        lambda: bi_level_gae(r, v, m, e, 1.0, 1.0, 1.0),
        lambda: turn_gae(r, v, m, e, 1.0, 1.0),
    ):
        with pytest.raises(ValueError, match=rf"token_rewards\[{b}, {t}\].*loss_mask 0"):
            fn()


def test_turn_end_mask_is_validated():
    r, v, m, e = make_batch(8)
    bad = e.clone()
    bad[0, 0] = True  # left of everything, M=0
    with pytest.raises(ValueError, match="loss_mask 0"):
        bi_level_gae(r, v, m, bad, 1.0, 1.0, 1.0)
    bad = e.clone()
    last = int(e[1].nonzero()[-1])
    bad[1, last] = False  # last sampled token not closing a turn
    with pytest.raises(ValueError, match="row 1"):
        turn_gae(r, v, m, bad, 1.0, 1.0)


def test_bi_level_one_token_per_turn_equals_masked_gae():
    # every turn is a single sampled token: bi-level == masked GAE with gamma = gamma_turn
    r, v, m, _ = make_batch(9, token_rewards=False)
    g = torch.Generator().manual_seed(0)
    m1 = m & (torch.rand(m.shape, generator=g) < 0.3)
    m1[:, 3] = True
    r1 = torch.where(m1, r + torch.randn(m.shape, generator=g), 0.0)
    tr, fv = truncation(m.shape[0], 9)
    a, ret = bi_level_gae(r1, v, m1, m1, 0.5, 0.9, 0.8, truncated=tr, final_values=fv)
    a2, ret2 = masked_gae(r1, v, m1, 0.9, 0.8, truncated=tr, final_values=fv)
    close(a, a2)
    close(ret, ret2)


def test_gamma_one_lam_one_give_monte_carlo_returns():
    # rewards only on turn ends; gamma_turn = gamma_token = lam = 1 -> every token's return is the
    # sum of the rewards from its turn on, whatever the values
    r, v, m, e = make_batch(10, token_rewards=False)
    mc = torch.where(m, r.flip(1).cumsum(1).flip(1), 0.0)
    _, ret = bi_level_gae(r, v, m, e, 1.0, 1.0, 1.0)
    close(ret, mc, 1e-4)
    _, ret = masked_gae(r, v, m, 1.0, 1.0)
    close(ret, mc, 1e-4)
    _, ret = turn_gae(r, v, m, e, 1.0, 1.0)
    close(ret, torch.where(e, mc, 0.0), 1e-4)


def test_empty_rows_and_empty_batch():
    r, v = torch.zeros(2, 4), torch.randn(2, 4)
    m = T([[0, 0, 0, 0], [0, 1, 1, 0]]).bool()
    for adv, ret in _all_concat(r, v, m, m & T([[0, 0, 1, 0]]).bool()).values():
        assert (adv[0] == 0).all() and (ret[0] == 0).all()
    z = torch.zeros(0, 4)
    adv, ret = masked_gae(z, z, z.bool(), 1.0, 1.0)
    assert adv.shape == (0, 4)


def test_float_mask_accepted_other_values_rejected():
    r, v, m, e = make_batch(11)
    close(masked_gae(r, v, m.float(), 0.9, 0.9)[0], masked_gae(r, v, m, 0.9, 0.9)[0])
    with pytest.raises(ValueError, match="0/1"):
        masked_gae(r, v, m.float() * 2, 0.9, 0.9)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_matches_cpu():
    r, v, m, e = make_batch(12, dtype=torch.bfloat16)
    tr, fv = truncation(r.shape[0], 12)
    cpu = _all_concat(r, v, m, e, truncated=tr, final_values=fv)
    cuda = [x.cuda() for x in (r, v, m, e, tr, fv)]
    gpu = _all_concat(*cuda[:4], truncated=cuda[4], final_values=cuda[5])
    for k in cpu:
        close(gpu[k][0].cpu(), cpu[k][0])
        close(gpu[k][1].cpu(), cpu[k][1])
    s, g = torch.randn(6), torch.tensor([0, 0, 1, 1, 1, 2])
    close(grpo_advantages(s.cuda(), g.cuda(), m.cuda())[0].cpu(), grpo_advantages(s, g, m)[0])


def test_reverse_scan_unit_path_equals_general_path():
    # c in {0, 1}: the segmented suffix sum must equal the doubling scan (and a plain loop)
    from vagent.rl.scan import reverse_scan

    g = torch.Generator().manual_seed(13)
    d = torch.randn(4, 300, generator=g)
    c = (torch.rand(4, 300, generator=g) > 0.05).float()
    c[1] = 1.0  # a row without reset
    c[2, -1] = 0.0
    ref = torch.zeros_like(d)
    nxt = torch.zeros(4)
    for j in reversed(range(300)):
        nxt = d[:, j] + c[:, j] * nxt
        ref[:, j] = nxt
    close(reverse_scan(d, c), ref, 1e-4)
    close(reverse_scan(d, c, unit=True), ref, 1e-4)
