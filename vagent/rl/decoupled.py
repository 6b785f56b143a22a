"""Decoupled PPO for batches whose trajectories mix weight versions, and their staleness metrics.

In fully asynchronous training a trajectory may span several weight versions: every sampled
token keeps the log-prob of the weights that sampled it (``behav_logprobs``) and that version's
number. Decoupled PPO (Hilton et al. 2022, "Batch size-invariance for policy optimization",
arXiv 2110.00641; AReaL, arXiv 2505.24298) separates the two roles the old policy plays in PPO:

- the **proximal** policy ``pi_prox`` anchors the trust region: the trainer's weights before this
  update, its log-probs recomputed by the trainer (``prox_logprobs``);
- the **behaviour** policy ``pi_behav`` sampled the token: a per-token importance weight
  ``w_t = pi_prox / pi_behav`` corrects for it, capped at ``C`` (``behav_cap``).

Per sampled token (loss mask ``M``), with ``r_t = exp(logp_t - logp_prox_t)``::

    l_t = -min(r_t A_t, clip(r_t, 1 - clip_low, 1 + clip_high) A_t) * w_t
    loss = aggregate(l, M, agg)                          (vagent.rl.losses.aggregate)

Two ways to cap ``w_t`` (``behav_mode``):

- ``"mask"`` (AReaL's ``behav_imp_weight_cap``; the ``action="mask"`` of its later
  ``rejection_sampling``): a token with ``w_t > C`` gets weight 0. It still counts in the
  denominator of the mean (AReaL divides by the loss mask's token count before the cap), so a
  masked token dilutes the loss instead of vanishing from it. (``vagent.rl.correction``'s
  ``rs_level="token"`` is verl's rejection, which removes the token from the count.)
- ``"truncate"`` (verl's rollout correction ``rollout_is: token``, Yao et al. 2025; AReaL's
  ``action="clamp"``): ``w_t = min(w_t, C)``. This is ``vagent.rl.correction.correct`` with
  ``is_level="token"`` and ``trainer = prox_logprobs``, ``engine = behav_logprobs``.

The PPO part is :func:`vagent.rl.losses.ppo_policy_loss` with ``old_logprobs = prox_logprobs`` and
the weights as its ``weights``; when every token was sampled by the proximal weights
(``behav == prox``) every ``w_t`` is 1 and the loss is PPO's, bit for bit. The weights are
detached: the gradient flows through ``logprobs`` only. Log-ratios are clamped to ``[-20, 20]``
before ``exp`` (``vagent.rl.correction.SAFETY_BOUND``, as verl). Shapes: ``[B, L]`` per-token
tensors. Verified on hand-built mixed-version batches against AReaL's ``ppo_actor_loss_fn`` and
verl's truncated IS (tests/rl/test_decoupled.py).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from vagent.rl.advantages import masked_mean
from vagent.rl.correction import SAFETY_BOUND
from vagent.rl.losses import PolicyLoss, ppo_policy_loss

__all__ = ["BEHAV_MODES", "BehaviourWeights", "DecoupledLoss", "behaviour_weights", "decoupled_ppo_loss",
           "staleness_metrics"]

BEHAV_MODES = ("mask", "truncate")
#: AReaL's example configs cap the behaviour weight at 5 (``behav_imp_weight_cap: 5.0``)
DEFAULT_BEHAV_CAP = 5.0


class BehaviourWeights(NamedTuple):
    """Output of :func:`behaviour_weights`: the capped weights and detached 0-dim statistics
    (token means over M; see ``metrics()`` for their logged names)."""

    weights: Tensor  # [B, L] float32, detached: w_t after the cap, 0 off M
    capped: Tensor  # [B, L] bool: sampled tokens whose raw w_t exceeded the cap (masked or truncated)
    weight_mean: Tensor  # mean of the raw w_t = pi_prox / pi_behav over M (before the cap)
    weight_max: Tensor  # max of the raw w_t over M (0 for an empty mask)
    capped_frac: Tensor  # share of the sampled tokens whose w_t exceeded the cap
    kl: Tensor  # k3 estimate of KL(pi_behav || pi_prox): mean of (w - 1) - log w over M

    def metrics(self, prefix: str = "loss/") -> dict[str, float]:
        """Python floats: ``loss/behav_weight_mean``, ``_weight_max``, ``_capped_frac``, ``loss/behav_kl``."""
        names = ("behav_weight_mean", "behav_weight_max", "behav_capped_frac", "behav_kl")
        vals = torch.stack([t.detach().float() for t in self[2:]]).tolist()
        return {prefix + k: v for k, v in zip(names, vals)}


class DecoupledLoss(NamedTuple):
    """Output of :func:`decoupled_ppo_loss`: the PPO part (ratio against the proximal policy) and
    the behaviour weights. ``loss`` is the differentiable scalar to minimise."""

    policy: PolicyLoss
    behaviour: BehaviourWeights

    @property
    def loss(self) -> Tensor:
        return self.policy.loss

    def metrics(self, prefix: str = "loss/") -> dict[str, float]:
        """``loss/policy``, ``loss/clip_frac``, ... (:class:`PolicyLoss`) and ``loss/behav_*``."""
        return {**self.policy.metrics(prefix), **self.behaviour.metrics(prefix)}


def _check_cap(cap: float | None, mode: str) -> None:
    if mode not in BEHAV_MODES:
        raise ValueError(f"behav_mode must be one of {BEHAV_MODES} ('mask': AReaL, 'truncate': verl), got {mode!r}")
    if cap is not None and not (math.isfinite(cap) and cap >= 1.0):
        raise ValueError(f"behav_cap must be a finite number >= 1 (a cap below 1 would cut on-policy tokens, "
                         f"whose weight is 1; AReaL uses 5.0) or None for no cap, got {cap!r}")


def behaviour_weights(prox_logprobs: Tensor, behav_logprobs: Tensor, mask: Tensor,
                      cap: float | None = DEFAULT_BEHAV_CAP, mode: str = "mask") -> BehaviourWeights:
    """Per-token behaviour importance weights ``w_t = pi_prox(a_t) / pi_behav(a_t)``, capped at
    ``cap`` by ``mode`` (the module docstring; ``cap=None``: uncapped).

    Args:
        prox_logprobs: [B, L] the trainer's log-probs before this update (no grad).
        behav_logprobs: [B, L] each token's sampling-time log-prob, from whichever weights
            version sampled it (no grad).
        mask: [B, L] the loss mask (1 iff the policy sampled the token).
    """
    _check_cap(cap, mode)
    m = mask.bool()
    log_w = torch.where(m, prox_logprobs.detach().float() - behav_logprobs.detach().float(), 0.0)
    log_w = log_w.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    raw = torch.exp(log_w) * m  # w_t = pi_prox / pi_behav, 0 off M
    capped = m & (raw > cap) if cap is not None else torch.zeros_like(m)
    if cap is None:
        weights = raw
    elif mode == "truncate":
        weights = raw.clamp(max=cap)  # min(w_t, C): verl's token TIS
    else:
        weights = torch.where(capped, 0.0, raw)  # w_t > C -> 0: AReaL's behav_imp_weight_cap
    return BehaviourWeights(
        weights=weights,
        capped=capped,
        weight_mean=masked_mean(raw, m),
        weight_max=raw.max() if m.any() else torch.zeros(()),
        capped_frac=masked_mean(capped.float(), m),
        kl=masked_mean(raw - 1.0 - log_w, m),  # k3 of KL(pi_behav || pi_prox), >= 0
    )


def decoupled_ppo_loss(
    logprobs: Tensor,
    prox_logprobs: Tensor,
    behav_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    behav_cap: float | None = DEFAULT_BEHAV_CAP,
    behav_mode: str = "mask",
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    agg: str = "token-mean",
) -> DecoupledLoss:
    """Decoupled PPO surrogate (the module docstring) for batches that mix weight versions::

        w_t = cap(exp(logp_prox_t - logp_behav_t), behav_cap, behav_mode)     (detached)
        r_t = exp(logp_t - logp_prox_t)
        l_t = max(-A_t r_t, -A_t clip(r_t, 1 - clip_low, 1 + clip_high)) * w_t
        loss = aggregate(l, M, agg)

    Args:
        logprobs: [B, L] log pi(a_t) under the current policy (requires grad).
        prox_logprobs: [B, L] the trainer's log-probs before this update (no grad).
        behav_logprobs: [B, L] sampling-time log-probs, per token of whichever version sampled it.
        advantages: [B, L]; mask: [B, L] loss mask.
        behav_cap, behav_mode: the cap C on w_t and how it applies (``"mask"``: AReaL, w_t > C -> 0;
            ``"truncate"``: verl, min(w_t, C)); None: no cap.
        clip_low, clip_high, dual_clip, agg: as :func:`vagent.rl.losses.ppo_policy_loss`.
    """
    behaviour = behaviour_weights(prox_logprobs, behav_logprobs, mask, behav_cap, behav_mode)
    policy = ppo_policy_loss(logprobs, prox_logprobs, advantages, mask, clip_low=clip_low, clip_high=clip_high,
                             dual_clip=dual_clip, agg=agg, weights=behaviour.weights)
    return DecoupledLoss(policy, behaviour)


def _nan_staleness(prefix: str) -> dict[str, float]:
    nan = float("nan")
    return {f"{prefix}staleness_{k}": nan for k in ("min", "mean", "max")} | {f"{prefix}multi_version_frac": nan}


def _check_versions(versions: Tensor, m: Tensor, trainer_version: int) -> None:
    """One-line errors for a sampled token without a version, or with one newer than the trainer."""
    for bad, what in ((versions < 0, "no weights version (< 0)"),
                      (versions > trainer_version, f"a weights version newer than the trainer's ({trainer_version})")):
        where = (bad & m).nonzero()
        if len(where):
            b, p = (int(i) for i in where[0])
            raise ValueError(f"sampled token at row {b} position {p} has {what}: version {int(versions[b, p])}; "
                             "the code that appends a sampled token must record the version that sampled it, "
                             "and trainer_version must be the version of the weights this update starts from")


def staleness_metrics(versions: Tensor, mask: Tensor, trainer_version: int, traj_ids: Tensor | None = None,
                      prefix: str = "rollout/") -> dict[str, float]:
    """How far behind the trainer the sampled tokens of a batch are (the per-token weights versions).

    Staleness of a sampled token = ``trainer_version - version`` (0: sampled by the weights this
    update starts from). Returns ``rollout/staleness_min``, ``_mean``, ``_max`` (over the sampled
    tokens) and ``rollout/multi_version_frac`` (the share of trajectories with a sampled token
    whose sampled tokens come from more than one version); all nan when no token is sampled.

    Args:
        versions: [B, L] integer: the weights version that sampled each token (any value off M).
        mask: [B, L] the loss mask (1 iff the policy sampled the token).
        trainer_version: the trainer's weights version before this update.
        traj_ids: [B] the trajectory of each row (rows of one trajectory share an id: per-turn
            batch modes), or None: each row is a trajectory.
    Raises ValueError (one line) when a sampled token's version is negative or newer than the
    trainer's, or the shapes disagree.
    """
    m = mask.bool()
    if versions.shape != m.shape or versions.dim() != 2:
        raise ValueError(f"versions and mask must both be [B, L], got {tuple(versions.shape)} and {tuple(m.shape)}")
    if traj_ids is not None and tuple(traj_ids.shape) != (m.shape[0],):
        raise ValueError(f"traj_ids must be [B] = [{m.shape[0]}] (one id per row), got {tuple(traj_ids.shape)}")
    if not bool(m.any()):
        return _nan_staleness(prefix)
    v = versions.long()
    _check_versions(v, m, trainer_version)
    stale = (trainer_version - v[m]).double()
    rows = m.any(-1)  # rows with a sampled token
    big = torch.iinfo(torch.long).max
    row_lo = torch.where(m, v, big).amin(-1)[rows]  # oldest version of each row
    row_hi = torch.where(m, v, -1).amax(-1)[rows]  # newest
    ids = (traj_ids.long() if traj_ids is not None else torch.arange(m.shape[0], device=m.device))[rows]
    _, traj = torch.unique(ids, return_inverse=True)  # row -> trajectory index
    n = int(traj.max()) + 1
    lo = torch.full((n,), big, dtype=torch.long, device=v.device).scatter_reduce(0, traj, row_lo, "amin")
    hi = torch.full((n,), -1, dtype=torch.long, device=v.device).scatter_reduce(0, traj, row_hi, "amax")
    vals = torch.stack([stale.min(), stale.mean(), stale.max(), (hi > lo).double().mean()]).tolist()
    names = ("staleness_min", "staleness_mean", "staleness_max", "multi_version_frac")
    return {prefix + k: x for k, x in zip(names, vals)}
