"""Group filters: train only on the groups whose rewards vary (RAGEN's variance filter, VAGEN Lite).

A group (n rollouts of one environment, seed and config) whose rewards are all equal gives GRPO
advantages of 0 and no gradient; ranking groups by reward variance and keeping the most varied
spends the update on informative groups.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

__all__ = ["FilterResult", "variance_filter"]

FILTER_MODES = ("top_k", "top_p")


class FilterResult(NamedTuple):
    """Output of :func:`variance_filter`."""

    kept_indices: Tensor  # long [n_kept], trajectory indices into the batch, ascending
    kept_groups: Tensor  # [G_kept] the kept group ids (values of group_ids), by decreasing variance
    scale: float  # multiply the kept advantages (or the loss) by this; 1.0 unless top_p rescales
    metrics: dict[str, float]  # filter/* statistics, see variance_filter


def variance_filter(
    scores: Tensor, group_ids: Tensor, mode: str = "top_k", value: float = 0.25, ddof: int = 0
) -> FilterResult:
    """Keep the groups with the highest reward variance (RAGEN, arXiv 2504.20073; VAGEN Lite).

    Per group g: ``var_g = 1/(n_g - ddof) sum_i (R_i - mean_g)^2`` (ddof=0, population variance as
    VAGEN Lite; a singleton group has variance 0). Groups are ranked by decreasing variance; ties
    go to the group whose first trajectory comes first in the batch (deterministic).

    - ``mode="top_k"``: keep ``max(1, ceil(value * G))`` groups, ``value`` in (0, 1]. ``scale`` = 1.
    - ``mode="top_p"``: keep the shortest prefix of the ranking whose variance sum reaches
      ``value * sum_g var_g`` (``value`` in (0, 1]); if every variance is 0, keep all groups.
      ``scale = sqrt(G_kept / G)`` (docs/algorithms.md reference section 6, as VAGEN Lite): multiply the kept
      advantages by it so that a smaller kept batch does not take larger steps.

    Args:
        scores: [B] trajectory rewards; group_ids: [B] int.
    Returns:
        FilterResult; metrics: ``filter/kept_groups``, ``filter/total_groups``, ``filter/kept_frac``
        (kept trajectories / B), ``filter/var_kept_share`` (kept variance / total, 1 if total 0),
        ``filter/zero_var_groups``, ``filter/scale``.
    """
    if mode not in FILTER_MODES:
        raise ValueError(f"mode must be one of {FILTER_MODES}, got {mode!r}")
    if not 0.0 < value <= 1.0:
        raise ValueError(f"value must be a fraction in (0, 1], got {value}")
    if scores.dim() != 1 or group_ids.shape != scores.shape or scores.numel() == 0:
        raise ValueError(f"scores and group_ids must be non-empty [B], got {tuple(scores.shape)}")
    x = scores.detach().float()
    B = x.numel()
    uniq, inv = torch.unique(group_ids, return_inverse=True)  # inv: dense group index [B]
    G = uniq.numel()
    var = _group_variances(x, inv, G, ddof)
    order = _ranking(var, inv)
    total = float(var.sum())
    n_keep = _groups_to_keep(var[order], total, mode, value)
    kept = order[:n_keep]
    keep_group = torch.zeros(G, dtype=torch.bool, device=x.device)
    keep_group[kept] = True
    kept_indices = keep_group[inv].nonzero()[:, 0]
    scale = math.sqrt(n_keep / G) if mode == "top_p" else 1.0
    metrics = {
        "filter/kept_groups": float(n_keep),
        "filter/total_groups": float(G),
        "filter/kept_frac": kept_indices.numel() / B,
        "filter/var_kept_share": float(var[kept].sum()) / total if total > 0 else 1.0,
        "filter/zero_var_groups": float((var == 0).sum()),
        "filter/scale": scale,
    }
    return FilterResult(kept_indices, uniq[kept], scale, metrics)


def _group_variances(x: Tensor, inv: Tensor, G: int, ddof: int) -> Tensor:
    """var_g [G] of the scores ``x`` [B] by dense group index ``inv`` [B]; a singleton group 0."""
    n = torch.zeros(G, device=x.device).index_add_(0, inv, torch.ones_like(x))
    mean = torch.zeros(G, device=x.device).index_add_(0, inv, x) / n
    ss = torch.zeros(G, device=x.device).index_add_(0, inv, (x - mean[inv]) ** 2)
    return torch.where(n > max(ddof, 1), ss / (n - ddof).clamp(min=1), 0.0)


def _ranking(var: Tensor, inv: Tensor) -> Tensor:
    """The group indices [G] by decreasing variance; ties: the group whose first row comes first."""
    G, B = var.numel(), inv.numel()
    first = torch.full((G,), B, dtype=torch.long, device=var.device)
    first = first.scatter_reduce(0, inv, torch.arange(B, device=var.device), "amin")
    order = torch.sort(first, stable=True).indices  # groups by first appearance
    return order[torch.sort(var[order], descending=True, stable=True).indices]  # by variance


def _groups_to_keep(ranked_var: Tensor, total: float, mode: str, value: float) -> int:
    """How many of the ranked groups (variances ``ranked_var`` [G], summing to ``total``) to keep."""
    G = ranked_var.numel()
    if mode == "top_k":
        return max(1, math.ceil(value * G))
    if total <= 0.0:
        return G  # nothing to rank: keep everything
    before = torch.cumsum(ranked_var, 0) - ranked_var  # variance kept before each group
    return max(1, int((before < value * total).sum()))  # add groups until the target is met
