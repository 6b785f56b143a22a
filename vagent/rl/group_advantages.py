"""Critic-free, group-relative advantage estimators: GRPO, RLOO, REINFORCE++ and GiGPO.

A group is the n rollouts of one environment, seed and config (``group_ids`` [B]); each
trajectory's score is its return. Every estimator returns ``(advantages, returns)``, float32
[B, L], the trajectory's (or, GiGPO, its step's) advantage broadcast over its M=1 tokens, and
returns == advantages (no critic). Pure tensor functions under ``torch.no_grad()``; the recipe's
use is ``vagent.recipes.grpo`` (docs/algorithms.md). Verified against hand-derived values and
plain loops in tests/rl/test_advantages.py.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch
from torch import Tensor

from vagent.rl.scan import bool_mask, mask_packing, reverse_scan

__all__ = ["gigpo_advantages", "grpo_advantages", "reinforce_pp_advantages", "rloo_advantages"]


# ----------------------------------------------------------------------------------------------
# critic-free, group-based estimators
# ----------------------------------------------------------------------------------------------


def _group_stats(x: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per-element group size n, mean and unbiased std (std 0 for singletons). x, group_ids [B]."""
    inv = torch.unique(group_ids, return_inverse=True)[1]  # dense group index per element
    G = int(inv.max()) + 1 if inv.numel() else 0
    n = torch.zeros(G, device=x.device).index_add_(0, inv, torch.ones_like(x))
    mean = torch.zeros(G, device=x.device).index_add_(0, inv, x) / n
    sq = torch.zeros(G, device=x.device).index_add_(0, inv, (x - mean[inv]) ** 2)
    std = (sq / (n - 1).clamp(min=1)).sqrt()  # unbiased (Bessel) std, as torch.std in verl/TRL
    return n[inv], mean[inv], std[inv]


def _group_normalize(x: Tensor, group_ids: Tensor, norm_by_std: bool, eps: float) -> Tensor:
    """(x - mean_g) / (std_g + eps) per element ([B] -> [B]); 0 for singleton groups."""
    n, mean, std = _group_stats(x, group_ids)
    a = x - mean  # x_i - mean_g
    if norm_by_std:
        a = a / (std + eps)  # / (std_g + eps)
    return torch.where(n > 1, a, 0.0)


def _check_scores(scores: Tensor, group_ids: Tensor, loss_mask: Tensor) -> Tensor:
    B = scores.shape[0] if scores.dim() == 1 else -1
    if B < 0 or group_ids.shape != scores.shape or loss_mask.dim() != 2 or loss_mask.shape[0] != B:
        raise ValueError(
            f"scores and group_ids must be [B] and loss_mask [B, L]; got {tuple(scores.shape)}, "
            f"{tuple(group_ids.shape)}, {tuple(loss_mask.shape)}"
        )
    return bool_mask(loss_mask, "loss_mask")


@torch.no_grad()
def grpo_advantages(
    scores: Tensor,
    group_ids: Tensor,
    loss_mask: Tensor,
    norm_by_std: bool = True,
    eps: float = 1e-6,
) -> tuple[Tensor, Tensor]:
    """GRPO outcome advantages (DeepSeekMath arXiv 2402.03300, section 4.1.2).

    A group is the n rollouts of one environment, seed and config::

        A_i = (R_i - mean_g R) / (std_g R + eps)      (norm_by_std=False: R_i - mean_g R, Dr. GRPO)

    std_g is the unbiased (Bessel, n-1) std, as ``torch.std`` in verl and TRL. A singleton group
    gets A = 0 (verl would give it A = R_i). A_i is broadcast over the trajectory's M=1 tokens.

    Args: scores [B] trajectory returns; group_ids [B] int; loss_mask [B, L].
    Returns: (advantages [B, L], returns [B, L]), returns == advantages (no critic).
    """
    m = _check_scores(scores, group_ids, loss_mask)
    a = _group_normalize(scores.float(), group_ids.to(scores.device), norm_by_std, eps)  # [B]
    adv = torch.where(m, a[:, None], 0.0)
    return adv, adv.clone()


@torch.no_grad()
def rloo_advantages(scores: Tensor, group_ids: Tensor, loss_mask: Tensor) -> tuple[Tensor, Tensor]:
    """RLOO (Ahmadian et al., arXiv 2402.14740): leave-one-out baseline within the group::

        A_i = R_i - 1/(n-1) sum_{j != i} R_j = n/(n-1) (R_i - mean_g R)

    Singleton group -> 0. Shapes as :func:`grpo_advantages`; returns == advantages.
    """
    m = _check_scores(scores, group_ids, loss_mask)
    x = scores.float()
    n, mean, _ = _group_stats(x, group_ids.to(x.device))
    a = torch.where(n > 1, n / (n - 1).clamp(min=1) * (x - mean), 0.0)  # n/(n-1) (R_i - mean)
    adv = torch.where(m, a[:, None], 0.0)
    return adv, adv.clone()


@torch.no_grad()
def reinforce_pp_advantages(
    scores: Tensor, group_ids: Tensor, loss_mask: Tensor
) -> tuple[Tensor, Tensor]:
    """REINFORCE++ with a group baseline (Hu, arXiv 2501.03262; verl's
    ``reinforce_plus_plus_baseline``)::

        A_i = R_i - mean_g R,   broadcast over M,   then whitened over all M=1 tokens of the batch

    (the global whitening replaces GRPO's per-group std). Singleton group -> R_i - R_i = 0 before
    whitening (verl leaves it un-centred). Shapes as :func:`grpo_advantages`.
    """
    m = _check_scores(scores, group_ids, loss_mask)
    x = scores.float()
    _, mean, _ = _group_stats(x, group_ids.to(x.device))
    a = x - mean  # R_i - mean_g, constant along row i
    # masked_whiten of the broadcast [B, L] tensor, from per-row token counts n_i (one pass less)
    n_i = torch.count_nonzero(m, dim=1).float()
    N = n_i.sum().clamp(min=1)
    mu = (n_i * a).sum() / N  # token mean over M
    var = (n_i * (a - mu) ** 2).sum() / (N - 1).clamp(min=1)  # unbiased token variance
    adv = torch.where(m, ((a - mu) * torch.rsqrt(var + 1e-8))[:, None], 0.0)
    return adv, adv.clone()


def _intern_keys(step_state_keys: Tensor | Sequence[Sequence[Hashable]], B: int, T: int, device):
    """Anchor-state keys -> long [B, T] (-1 = no step). A tensor is used as is (-1 = padding)."""
    if isinstance(step_state_keys, Tensor):
        if step_state_keys.shape != (B, T):
            raise ValueError(f"step_state_keys tensor must be [B, T] = [{B}, {T}]")
        return step_state_keys.to(device).long()
    if len(step_state_keys) != B:
        raise ValueError(f"step_state_keys must hold one list of keys per trajectory ({B})")
    table: dict[Hashable, int] = {}
    ids = torch.full((B, T), -1, dtype=torch.long)
    for b, keys in enumerate(step_state_keys):  # interning hashable keys; no arithmetic here
        if len(keys) > T:
            raise ValueError(f"trajectory {b}: {len(keys)} step keys, step_rewards has {T} columns")
        if len(keys):
            ids[b, : len(keys)] = torch.tensor([table.setdefault(k, len(table)) for k in keys])
    return ids.to(device)


@torch.no_grad()
def gigpo_advantages(
    scores: Tensor,
    group_ids: Tensor,
    step_rewards: Tensor,
    step_state_keys: Tensor | Sequence[Sequence[Hashable]],
    loss_mask: Tensor,
    turn_ids_per_token: Tensor,
    gamma: float = 0.95,
    omega: float = 1.0,
    norm_by_std: bool = True,
    eps: float = 1e-6,
) -> tuple[Tensor, Tensor]:
    """GiGPO (Feng et al., arXiv 2505.10978): episode-level plus step-level group advantages.

    Episode level (GRPO over the group of trajectories)::

        A_E(i) = (R_i - mean_g R) / (std_g R + eps)

    Step level: the steps (turns) of a group's trajectories that saw the same environment state
    (equal ``step_state_keys`` within one group, including repeats inside one trajectory) form an
    anchor-state group S; each step's return is the discounted return from that step::

        G_t^i  = sum_{k >= t} gamma^(k-t) r_k^i
        A_S(i, t) = (G_t^i - mean_S G) / (std_S G + eps)

        A(i, t) = A_E(i) + omega * A_S(i, t),   on every M=1 token of step t of trajectory i

    std is unbiased; a singleton group (episode or step) contributes 0 (verl-agent uses mean 0 /
    std 1 there, i.e. the raw return). norm_by_std=False drops the division (GiGPO "mean_norm").

    Args:
        scores: [B] episode returns R_i; group_ids: [B] int.
        step_rewards: [B, T] per-step rewards r_t, T = max steps; 0 beyond a trajectory's steps.
        step_state_keys: one sequence of hashable keys per trajectory (length = its step count
            T_b <= T), or a long tensor [B, T] with -1 after the last step.
        loss_mask: [B, L]; turn_ids_per_token: [B, L] long, the step index (0..T_b-1) of each
            M=1 token (any value at M=0).
    Returns:
        (advantages [B, L], returns [B, L]), returns == advantages (no critic).
    """
    m = _check_scores(scores, group_ids, loss_mask)
    B, T = step_rewards.shape
    dev = m.device
    keys = _intern_keys(step_state_keys, B, T, dev)
    has_step = keys >= 0  # [B, T]
    if (has_step[:, 1:] & ~has_step[:, :-1]).any():
        raise ValueError("step_state_keys: -1 (no step) must only pad the end of a trajectory")
    r = step_rewards.float().to(dev)
    if (torch.where(has_step, 0.0, r) != 0).any():
        raise ValueError("step_rewards is non-zero after a trajectory's last step (no state key)")
    g = reverse_scan(r, torch.full_like(r, gamma))  # G_t = r_t + gamma G_(t+1)
    gid = group_ids.to(dev).long()
    a_ep = _group_normalize(scores.float().to(dev), gid, norm_by_std, eps)  # A_E [B]
    gid = torch.unique(gid, return_inverse=True)[1]  # dense group index 0..G-1
    pair = gid[:, None] * (int(keys.max()) + 1) + keys  # one int per (group, state); -1 unused
    anchor = torch.unique(pair[has_step], return_inverse=True)[1]  # anchor-state group per step
    a_step = torch.zeros(B, T, device=dev)
    a_step[has_step] = _group_normalize(g[has_step], anchor, norm_by_std, eps)  # A_S [B, T]
    p = mask_packing(m)  # work on the M=1 tokens only
    row = torch.div(p.src, m.shape[1], rounding_mode="floor")
    tid = turn_ids_per_token.reshape(-1).to(dev).index_select(0, p.src).long()  # step of each token
    if ((tid < 0) | (tid >= has_step.sum(1)[row])).any():
        raise ValueError("turn_ids_per_token must give a step index in [0, T_b) on every M=1 token")
    a_tok = a_ep[row] + omega * a_step.view(-1)[row * T + tid]  # A_E + omega A_S
    adv = torch.zeros(m.numel(), device=dev).index_copy_(0, p.src, a_tok).view(m.shape)
    return adv, adv.clone()
