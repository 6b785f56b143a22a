"""Advantage estimators with a critic for multi-turn agents (GAE at the token, turn and bi-level
scale; no-concat GAE) and the masked reductions: pure, batched tensor functions. The critic-free,
group-relative estimators (GRPO, RLOO, REINFORCE++, GiGPO) are :mod:`vagent.rl.group_advantages`.

Every estimator returns ``(advantages, returns)``, both float32 ``[B, L]``, NOT whitened (whiten
with :func:`masked_whiten` in the recipe), and zero outside the positions where each is defined.
Inputs may be float32 or bfloat16 on CPU or GPU; all arithmetic runs in float32. Estimators run
under ``torch.no_grad()``: advantages and returns are constants for the losses.

Vocabulary (docs/algorithms.md reference section 5): ``t`` a token position, ``M`` the loss mask (1 iff the policy
sampled the token), ``e_k`` the last sampled token of turn ``k`` (``turn_end_mask``), ``t'`` the
next M=1 position after ``t``. Observation, image, template and padding tokens have M=0 and are
skipped as if the M=1 tokens were contiguous; left and right padding are both fine.

Rewards live on sampled tokens. A non-zero reward on an M=0 token is an error (it would be
silently dropped otherwise): put a trajectory reward on the final sampled token and a turn reward
on e_k.

Terminated vs truncated (Gymnasium semantics, docs/algorithms.md reference section 11 bug 4): after the last
sampled token the next value is 0 when the episode terminated, and ``final_values[b]`` (the
critic's value of the observation that followed, computed by the caller) when ``truncated[b]``.
The legacy code never bootstrapped.

How it is vectorised (:mod:`vagent.rl.scan`): the M=1 tokens of each row are packed to the left
of a [B, n] table (``nonzero`` of the mask, n = most M=1 tokens in a row); every GAE here is then
the first-order reverse recurrence ``y_j = d_j + c_j y_{j+1}`` over the packed positions, solved
by :func:`~vagent.rl.scan.reverse_scan`, a log-depth doubling scan (ceil(log2 n) elementwise steps over the whole
batch), or a segmented float64 suffix sum when gamma * lam = 1 (the paper's token level). No
Python loop over rows or positions; zeros in ``c`` (a reset at a turn end) are exact
because only products, never divisions, are used.

Verified: against plain per-row loops in tests/rl/test_advantages.py (float32 and bf16, random
padded multi-turn batches); speed in bench/advantages.py.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from vagent.rl.scan import Packed, bool_mask, mask_packing, pack, packed_valid, reverse_scan, unpack

__all__ = [
    "anchor_mask",
    "bi_level_gae",
    "masked_gae",
    "masked_mean",
    "masked_sum",
    "masked_whiten",
    "no_concat_gae",
    "turn_gae",
]

# ----------------------------------------------------------------------------------------------
# masked reductions
# ----------------------------------------------------------------------------------------------


def masked_sum(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """``sum(x * M)`` over ``dim`` (all elements if None); values at M=0 are ignored, even nan."""
    x = torch.where(mask.bool(), x.float(), 0.0)
    return x.sum() if dim is None else x.sum(dim)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """``sum(x * M) / sum(M)`` over ``dim``; 0 where the mask is empty (no division by zero)."""
    count = masked_sum(torch.ones_like(x, dtype=torch.float32), mask, dim)
    return masked_sum(x, mask, dim) / count.clamp(min=1.0)


def masked_whiten(x: Tensor, mask: Tensor, shift_mean: bool = True, eps: float = 1e-8) -> Tensor:
    """Whiten ``x`` over the M=1 entries of the whole batch: ``(x - mu) / sqrt(var + eps)``.

    ``mu`` and ``var`` are the mean and the unbiased (Bessel-corrected, as verl) variance over M=1.
    ``shift_mean=False`` adds ``mu`` back (scale only). Returns float32, 0 at M=0.
    A single M=1 entry has no variance and whitens to 0.
    """
    m = mask.bool()
    x = x.float()
    n = m.sum().clamp(min=1).float()
    mu = masked_sum(x, m) / n  # mean over M=1
    var = masked_sum((x - mu) ** 2, m) / (n - 1).clamp(min=1.0)  # unbiased variance over M=1
    out = (x - mu) * torch.rsqrt(var + eps)  # (x - mu) / sqrt(var + eps)
    if not shift_mean:
        out = out + mu
    return torch.where(m, out, 0.0)


# ----------------------------------------------------------------------------------------------
# internal helpers: validation, bootstrap (compaction and the scan: vagent.rl.scan)
# ----------------------------------------------------------------------------------------------


def _check_rewards_on_mask(rewards: Tensor, p: Packed, name: str = "token_rewards") -> None:
    """ValueError if a reward is non-zero outside the mask (counted, then located on failure)."""
    inside = rewards.reshape(-1).index_select(0, p.src)
    if int(torch.count_nonzero(rewards)) == int(torch.count_nonzero(inside)):
        return
    outside = torch.ones(p.shape, dtype=torch.bool, device=rewards.device)
    outside.view(-1)[p.src] = False
    bad = (rewards != 0) & outside
    b, t = (int(i) for i in bad.nonzero()[0])
    raise ValueError(
        f"{name}[{b}, {t}] = {float(rewards[b, t])} sits on a token with loss_mask 0 "
        f"({int(bad.sum())} such tokens). Rewards must sit on sampled tokens: put the trajectory "
        "reward on the final sampled token and each turn reward on its turn-end token e_k."
    )


def _bootstrap(truncated: Tensor | None, final_values: Tensor | None, n: int, device) -> Tensor:
    """Value after the last sampled token of each row: final_values if truncated, else 0. -> [n]"""
    if truncated is None and final_values is None:
        return torch.zeros(n, device=device)
    if truncated is None or final_values is None:
        raise ValueError(
            "pass both truncated (bool [B]) and final_values ([B]) or neither: a truncated episode "
            "bootstraps from final_values, a terminated one from 0"
        )
    if truncated.shape != (n,) or final_values.shape != (n,):
        raise ValueError(
            f"truncated and final_values must have shape ({n},), got {tuple(truncated.shape)} "
            f"and {tuple(final_values.shape)}"
        )
    return torch.where(truncated.to(device).bool(), final_values.to(device).float(), 0.0)


def _next(x: Tensor, last: Tensor, count: Tensor) -> Tensor:
    """x_next[b, j] = x[b, j+1] for j < count[b]-1, ``last[b]`` at j = count[b]-1. x [B, n]."""
    nxt = F.pad(x[:, 1:], (0, 1))
    j = torch.arange(x.shape[1], device=x.device)
    return torch.where(j[None, :] == (count - 1)[:, None], last[:, None], nxt)


def _turn_packing(turn_end_mask: Tensor, p: Packed) -> tuple[Tensor, Packed]:
    """Validate e_k against the loss mask; return ec (bool [B, n], turn ends among the packed
    tokens) and the packing of ec itself (turns packed to [B, K])."""
    e = bool_mask(turn_end_mask, "turn_end_mask", torch.Size(p.shape))
    ec = pack(e, p) > 0  # turn ends among the packed tokens
    if int(torch.count_nonzero(e)) != int(torch.count_nonzero(ec)):
        raise ValueError(
            "turn_end_mask marks tokens with loss_mask 0: e_k must be the last SAMPLED token of "
            "turn k (mark the final token the policy generated, not an observation/template token)"
        )
    # the last M=1 token of every non-empty row must close a turn, else its tokens have no e_k
    last_is_end = ec.gather(1, (p.row_counts - 1).clamp(min=0)[:, None])[:, 0] | (p.row_counts == 0)
    if not bool(last_is_end.all()):
        b = int((~last_is_end).nonzero()[0])
        raise ValueError(
            f"row {b}: the last sampled token is not marked in turn_end_mask. Every sampled token "
            "must belong to a turn that ends at an e_k; mark the final sampled token even when the "
            "turn was cut by the token budget (and pass truncated/final_values to bootstrap)."
        )
    return ec, mask_packing(ec)


# ----------------------------------------------------------------------------------------------
# critic-based estimators (concat mode)
# ----------------------------------------------------------------------------------------------


@torch.no_grad()
def masked_gae(
    token_rewards: Tensor,
    values: Tensor,
    loss_mask: Tensor,
    gamma: float,
    lam: float,
    truncated: Tensor | None = None,
    final_values: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Masked GAE (VAGEN-Base, VAGEN arXiv 2510.16907; GAE of Schulman et al. 1506.02438).

    One GAE chain over the M=1 positions only, as if they were contiguous::

        delta_t = r_t + gamma V(t') - V(t)          t' = next M=1 position
        A_t     = delta_t + gamma lam A_(t')        A after the last M=1 token = 0
        V(after last) = final_values[b] if truncated[b] else 0
        returns_t = A_t + V(t)                      on M=1, 0 elsewhere

    Args:
        token_rewards: [B, L]; non-zero only on M=1 tokens (ValueError otherwise).
        values: [B, L] critic values V(t); read only at M=1.
        loss_mask: [B, L] bool or 0/1.
        gamma, lam: discount and GAE lambda.
        truncated: optional bool [B]; final_values: optional [B] (both or neither).
    Returns:
        (advantages [B, L], returns [B, L]) float32, 0 at M=0.
    """
    p = mask_packing(bool_mask(loss_mask, "loss_mask", token_rewards.shape))
    _check_rewards_on_mask(token_rewards, p)
    boot = _bootstrap(truncated, final_values, p.shape[0], token_rewards.device)
    rc, vc = pack(token_rewards, p), pack(values, p)  # [B, n] packed r_t, V(t)
    delta = rc + gamma * _next(vc, boot, p.row_counts) - vc  # r_t + gamma V(t') - V(t)
    delta = torch.where(packed_valid(p), delta, 0.0)
    c = torch.full_like(delta, gamma * lam)
    adv = reverse_scan(delta, c, unit=gamma * lam == 1.0)  # A_t = delta_t + g l A_t'
    return unpack(adv, p), unpack(adv + vc, p)  # returns = A + V on M


def _turn_core(rk: Tensor, vk: Tensor, k_count: Tensor, boot: Tensor, gamma_turn, lam) -> Tensor:
    """Turn-level GAE on packed turns. rk, vk [B, K] turn rewards and V(e_k); k_count [B] turns
    per row; boot [B] value after the last turn. Returns A_k [B, K] (0 after the last turn)."""
    delta = rk + gamma_turn * _next(vk, boot, k_count) - vk  # r_k + g_turn V(e_k+1) - V(e_k)
    delta = torch.where(torch.arange(rk.shape[1], device=rk.device) < k_count[:, None], delta, 0.0)
    return reverse_scan(delta, torch.full_like(delta, gamma_turn * lam))  # A_k = d_k + g l A_k+1


@torch.no_grad()
def bi_level_gae(
    token_rewards: Tensor,
    values: Tensor,
    loss_mask: Tensor,
    turn_end_mask: Tensor,
    gamma_token: float,
    gamma_turn: float,
    lam: float,
    truncated: Tensor | None = None,
    final_values: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Bi-Level GAE (VAGEN-Full, VAGEN arXiv 2510.16907, docs/algorithms.md reference section 5).

    1. Turn level over the turn ends e_1..e_K with gamma_turn::

           delta_k = r(e_k) + gamma_turn V(e_(k+1)) - V(e_k)     V(e_(K+1)) = bootstrap (0 or final)
           A_k     = delta_k + gamma_turn lam A_(k+1)

    2. Token level inside each turn with gamma_token; at e_k the reward is Rhat_k = A_k + V(e_k)
       with next value 0 and the running GAE reset, so ``A(e_k) = A_k``; before e_k::

           delta_t = r_t + gamma_token V(t') - V(t)      A_t = delta_t + gamma_token lam A_(t')

    3. returns = A + V on M (whiten the advantages over M in the recipe).

    Rewards at e_k feed the turn level; rewards on other M=1 tokens (e.g. a per-token KL penalty)
    feed the token level. Paper defaults: gamma_token 1.0, gamma_turn 0.95, lam 1.0.

    Args:
        token_rewards, values: [B, L]; loss_mask: [B, L] bool or 0/1.
        turn_end_mask: [B, L] marks e_k; must be a subset of loss_mask and include the last M=1
            token of every row (ValueError otherwise).
        truncated: optional bool [B]; final_values: optional [B]: V(e_(K+1)) for truncated rows.
    Returns:
        (advantages [B, L], returns [B, L]) float32, 0 at M=0.
    """
    p = mask_packing(bool_mask(loss_mask, "loss_mask", token_rewards.shape))
    _check_rewards_on_mask(token_rewards, p)
    ec, pe = _turn_packing(turn_end_mask, p)  # turn ends among packed tokens; turns packed [B, K]
    boot = _bootstrap(truncated, final_values, p.shape[0], token_rewards.device)
    rc, vc = pack(token_rewards, p), pack(values, p)  # [B, n]
    ak = _turn_core(pack(rc, pe), pack(vc, pe), pe.row_counts, boot, gamma_turn, lam)  # A_k [B, K]
    # token level: d = A_k at e_k (next value 0, reset), r_t + g V(t') - V(t) before it
    delta = rc + gamma_token * _next(vc, torch.zeros_like(boot), p.row_counts) - vc
    d = torch.where(ec, unpack(ak, pe), delta)  # unpack(ak, pe): A_k placed at e_k
    d = torch.where(packed_valid(p), d, 0.0)
    c = torch.where(ec, 0.0, gamma_token * lam)  # reset the chain at e_k
    adv = reverse_scan(d, c, unit=gamma_token * lam == 1.0)
    return unpack(adv, p), unpack(adv + vc, p)  # returns = A + V on M


@torch.no_grad()
def turn_gae(
    token_rewards: Tensor,
    values: Tensor,
    loss_mask: Tensor,
    turn_end_mask: Tensor,
    gamma_turn: float,
    lam: float,
    truncated: Tensor | None = None,
    final_values: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Turn-wise GAE (VAGEN arXiv 2510.16907): the turn-level half of Bi-Level GAE only.

    A turn is an action of a turn-level MDP, so its reward is the sum of the rewards on its M=1
    tokens, ``r_k = sum_{t in turn k} r_t`` (usually only r(e_k) is non-zero); its value is
    V(e_k)::

        delta_k = r_k + gamma_turn V(e_(k+1)) - V(e_k)    A_k = delta_k + gamma_turn lam A_(k+1)
        advantages_t = A_k for every M=1 token t of turn k
        returns = A_k + V(e_k) at e_k only (0 elsewhere): train the critic with turn_end_mask.

    Args/Returns: as :func:`bi_level_gae` (no gamma_token).
    """
    p = mask_packing(bool_mask(loss_mask, "loss_mask", token_rewards.shape))
    _check_rewards_on_mask(token_rewards, p)
    ec, pe = _turn_packing(turn_end_mask, p)  # turn ends among packed tokens; turns packed [B, K]
    boot = _bootstrap(truncated, final_values, p.shape[0], token_rewards.device)
    rc, vc = pack(token_rewards, p), pack(values, p)  # [B, n]
    K = pe.n
    turn_of = torch.where(packed_valid(p), ec.long().cumsum(1) - ec.long(), K)  # turn k of each token
    rk = torch.zeros(p.shape[0], K + 1, device=rc.device).scatter_add_(1, turn_of, rc)[:, :K]
    vk = pack(vc, pe)  # r_k = sum of the turn's token rewards; V(e_k)
    ak = _turn_core(rk, vk, pe.row_counts, boot, gamma_turn, lam)  # A_k [B, K]
    adv = F.pad(ak, (0, 1)).gather(1, turn_of)  # A_k on every token of turn k
    return unpack(adv, p), unpack(unpack(ak + vk, pe), p)  # returns A_k + V(e_k) at e_k only


# ----------------------------------------------------------------------------------------------
# no-concat mode: one row per turn
# ----------------------------------------------------------------------------------------------


def anchor_mask(loss_mask: Tensor, anchor: str = "first") -> Tensor:
    """Bool [N, L]: the first (``anchor="first"``) or last (``"last"``) M=1 token of each row.

    In no-concat mode the critic is trained only here (docs/algorithms.md reference section 11, bug 3).
    """
    m = bool_mask(loss_mask, "loss_mask")
    if anchor == "first":
        return m & (m.cumsum(1) == 1)
    if anchor == "last":
        return m & (m.flip(1).cumsum(1).flip(1) == 1)
    raise ValueError(f"anchor must be 'first' or 'last', got {anchor!r}")


@torch.no_grad()
def no_concat_gae(
    turn_rewards: Tensor,
    values: Tensor,
    loss_mask: Tensor,
    traj_ids: Tensor,
    turn_ids: Tensor,
    gamma: float,
    lam: float,
    anchor: str = "first",
    truncated: Tensor | None = None,
    final_values: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """No-concat GAE (VAGEN Lite's ``no_concat_gae``): turn-level GAE across per-turn rows.

    Each row is one turn (its own prompt + response); rows of one trajectory share ``traj_ids``
    and are ordered by ``turn_ids``; rows may come in any order. With V_k the value at the row's
    anchor token (first or last M=1 token)::

        delta_k = r_k + gamma V_(k+1) - V_k       A_k = delta_k + gamma lam A_(k+1)
        V_(K+1) = final_values[row] if truncated[row] else 0   (read on the LAST turn only)
        advantages = A_k on every M=1 token of the row
        returns    = A_k + V_k at the anchor token only (see :func:`anchor_mask`), 0 elsewhere

    Args:
        turn_rewards: [N] per-turn reward, or [N, L] token rewards summed over the row's M=1 tokens
            (non-zero at M=0 is a ValueError), as VAGEN Lite sums the response's scores.
        values: [N, L]; loss_mask: [N, L]; every row needs at least one M=1 token.
        traj_ids: [N] int, unique per (group, trajectory); turn_ids: [N] int, distinct within a
            trajectory (gaps allowed: only the order matters). Duplicate pairs are a ValueError
            (drop padding duplicates before calling).
        truncated: optional bool [N]; final_values: optional [N]; per row, ignored except on each
            trajectory's last turn.
    Returns:
        (advantages [N, L], returns [N, L]) float32.
    """
    m = bool_mask(loss_mask, "loss_mask", values.shape)
    N = m.shape[0]
    if not m.any(1).all():
        raise ValueError("no_concat_gae: a row has no M=1 token, hence no value anchor; drop it")
    if turn_rewards.dim() == 2:
        _check_rewards_on_mask(turn_rewards, mask_packing(m), "turn_rewards")
        turn_rewards = masked_sum(turn_rewards, m, 1)  # r_k = sum of the row's token rewards
    if turn_rewards.shape != (N,) or traj_ids.shape != (N,) or turn_ids.shape != (N,):
        raise ValueError(
            f"turn_rewards, traj_ids and turn_ids must have shape ({N},), got "
            f"{tuple(turn_rewards.shape)}, {tuple(traj_ids.shape)}, {tuple(turn_ids.shape)}"
        )
    boot = _bootstrap(truncated, final_values, N, m.device)
    am = anchor_mask(m, anchor)
    v_anchor = torch.where(am, values.float(), 0.0).sum(1)  # V_k: [N]
    traj, turn = traj_ids.to(m.device).long(), turn_ids.to(m.device).long()
    perm = torch.sort(turn, stable=True).indices  # order by (traj, turn): sort by turn, then traj
    perm = perm[torch.sort(traj[perm], stable=True).indices]
    tr, tu = traj[perm], turn[perm]
    if ((tr[1:] == tr[:-1]) & (tu[1:] == tu[:-1])).any():
        raise ValueError("no_concat_gae: duplicate (traj_id, turn_id) rows; drop padding copies")
    same = F.pad(tr[1:] == tr[:-1], (0, 1), value=False)  # next sorted row continues the trajectory
    vs = v_anchor[perm]
    v_next = torch.where(same, F.pad(vs[1:], (0, 1)), boot[perm])  # V_(k+1), bootstrap on last turn
    delta = turn_rewards.float().to(m.device)[perm] + gamma * v_next - vs  # r_k + g V_k+1 - V_k
    c = torch.where(same, gamma * lam, 0.0)  # chain only within a trajectory
    a_sorted = reverse_scan(delta[None, :], c[None, :])[0]
    ak = torch.empty_like(a_sorted).scatter_(0, perm, a_sorted)  # back to row order
    adv = torch.where(m, ak[:, None], 0.0)
    return adv, torch.where(am, (ak + v_anchor)[:, None], 0.0)
