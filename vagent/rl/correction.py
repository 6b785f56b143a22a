"""Engine/trainer mismatch: its metrics, and the rollout corrections (truncated importance sampling,
rejection, decoupled PPO) that keep a policy-gradient update unbiased when the sampler is not the
trainer.

The sampling engine (HF generate with a KV cache, vLLM's bf16 kernels, a replica a push may have
missed) and the trainer's forward are different programs, so the tokens of a batch are drawn from
``pi_engine`` while the update differentiates ``pi_trainer``. With ``lr = log pi_trainer - log
pi_engine`` per sampled token (mask ``M``) and ``rho = exp(lr)``:

- mismatch (:func:`mismatch_metrics`): ``kl`` = token mean of ``rho - 1 - lr`` (the k3 estimator
  of KL(pi_engine || pi_trainer) on the engine's samples), ``abs_logprob_diff_mean`` / ``_max`` of
  ``|lr|``, ``ppl_ratio`` = row mean of ``exp(mean_t(-log pi_trainer)) / exp(mean_t(-log
  pi_engine))`` (trainer perplexity over engine perplexity, per row then averaged);
- token-level truncated IS (Yao et al. 2025, "Your efficient RL framework secretly brings you
  off-policy RL training"; verl ``rollout_is: token``): each token's loss x ``min(rho_t, C)``;
- sequence-level truncated IS (verl ``rollout_is: sequence``): every token of row b x
  ``min(prod_t rho_t, C)``;
- rejection / masked IS (verl ``rollout_rs``): tokens (``token``), rows (``sequence``: ``prod_t
  rho_t``; ``geometric``: ``exp(mean_t lr_t)``) whose ratio leaves ``[lo, hi]`` are taken out of
  the loss mask (no gradient, not counted in the token mean); ``veto``: a row with any token of
  ``rho_t < veto`` is taken out whole;
- decoupled PPO (Hilton et al. 2022, arXiv 2110.00641; AReaL arXiv 2505.24298) for rollouts one
  update old (``rollout.overlap: 1``): the PPO ratio is taken against the proximal policy (the
  trainer's log-probs before this update) and the behaviour weight ``min(pi_prox / pi_behav, C)``
  multiplies the loss: the token-level TIS above with ``pi_trainer = pi_prox``.

Every log-ratio is clamped to ``[-20, 20]`` before ``exp`` (verl's ``SAFETY_BOUND``); the
weights are detached (they change the measure, not the objective). Shapes: ``[B, L]`` per-token
tensors, ``M`` the loss mask. Equal to verl's ``rollout_corr_helper`` (``compute_rollout_
correction_weights``, ``compute_rollout_rejection_mask``, the veto of ``compute_rollout_correction_
and_rejection_mask``, ``compute_offpolicy_metrics``'s ``k3_kl`` and ``ppl_ratio``) on the same
inputs; tests/rl/test_correction.py derives the values by hand.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from vagent.rl.advantages import masked_mean, masked_sum

__all__ = ["IS_LEVELS", "RS_LEVELS", "Correction", "CorrectionSettings", "SAFETY_BOUND", "correct",
           "mismatch_metrics", "k3_kl"]

SAFETY_BOUND = 20.0  # |log ratio| clamp before exp (verl's SAFETY_BOUND)
IS_LEVELS = ("none", "token", "sequence")
RS_LEVELS = ("none", "token", "sequence", "geometric")


def k3_kl(logp: Tensor, logq: Tensor, mask: Tensor) -> float:
    """Token mean over ``mask`` of ``r - 1 - log r`` with ``r = exp(logp - logq)``: the k3
    estimate of KL(q || p) from tokens sampled from q (>= 0)."""
    lr = (logp.float() - logq.float()).clamp(-SAFETY_BOUND, SAFETY_BOUND)
    return float(masked_mean(torch.exp(lr) - 1.0 - lr, mask))


def _gap(trainer: Tensor, engine: Tensor, mask: Tensor) -> dict[str, float]:
    """kl, abs_logprob_diff_mean / _max and ppl_ratio of one token selection (nan when empty)."""
    m = mask.bool()
    if not bool(m.any()):
        nan = float("nan")
        return {"kl": nan, "abs_logprob_diff_mean": nan, "abs_logprob_diff_max": nan, "ppl_ratio": nan}
    diff = (trainer.float() - engine.float()).abs()
    rows = m.any(-1)  # rows with at least one selected token
    # per row: log(ppl_trainer / ppl_engine) = mean_t(log pi_engine) - mean_t(log pi_trainer)
    log_ppl_ratio = masked_mean(engine, m, -1) - masked_mean(trainer, m, -1)
    return {
        "kl": k3_kl(trainer, engine, m),
        "abs_logprob_diff_mean": float(masked_mean(diff, m)),
        "abs_logprob_diff_max": float(diff[m].max()),
        "ppl_ratio": float(torch.exp(log_ppl_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND))[rows].mean()),
    }


def mismatch_metrics(trainer: Tensor, engine: Tensor, mask: Tensor, image_context: Tensor | None = None,
                     prefix: str = "mismatch/") -> dict[str, float]:
    """``mismatch/{kl, abs_logprob_diff_mean, abs_logprob_diff_max, ppl_ratio}`` of the sampled
    tokens (``mask`` [B, L]), and the same with ``_image`` / ``_text`` appended for the tokens
    whose context holds an image (``image_context`` [B, L] bool) and those whose context holds
    none (a split without tokens is left out).

    ``trainer`` [B, L]: the trainer's log-probs of the tokens at the weights that sampled them;
    ``engine`` [B, L]: the engine's sampling-time log-probs of the same tokens.
    """
    m = mask.bool()
    out = {f"{prefix}{k}": v for k, v in _gap(trainer, engine, m).items()}
    if image_context is not None:
        img = image_context.bool()
        for suffix, part in (("_image", m & img), ("_text", m & ~img)):
            if bool(part.any()):  # an empty split is left out (no nan in the logs)
                out.update({f"{prefix}{k}{suffix}": v for k, v in _gap(trainer, engine, part).items()})
    return out


@dataclass(frozen=True)
class CorrectionSettings:
    """What :func:`correct` applies (the run config's ``rollout_correction`` section)."""

    is_level: Literal["none", "token", "sequence"] = "none"
    is_threshold: float = 2.0  # C: IS weights are truncated at C
    rs_level: Literal["none", "token", "sequence", "geometric"] = "none"
    rs_low: float | None = None  # lower bound of the accepted ratio (None: 1 / rs_high)
    rs_high: float = 2.0  # upper bound of the accepted ratio
    veto_threshold: float | None = None  # a row with a token of rho_t below this is rejected whole

    def __post_init__(self) -> None:
        if self.is_level not in IS_LEVELS or self.rs_level not in RS_LEVELS:
            raise ValueError(f"is_level must be one of {IS_LEVELS} and rs_level one of {RS_LEVELS}, got "
                             f"{self.is_level!r} / {self.rs_level!r}")
        for name in ("is_threshold", "rs_high", "rs_low", "veto_threshold"):
            v = getattr(self, name)
            if v is not None and not (math.isfinite(v) and v > 0):
                raise ValueError(f"rollout_correction.{name} must be a finite number > 0, got {v}")
        if self.rs_low is not None and self.rs_low >= self.rs_high:
            raise ValueError(f"rollout_correction.rs_low ({self.rs_low}) must be below rs_high ({self.rs_high})")

    @property
    def active(self) -> bool:
        """Whether any correction changes the update."""
        return self.is_level != "none" or self.rs_level != "none" or self.veto_threshold is not None

    @property
    def low(self) -> float:
        return self.rs_low if self.rs_low is not None else 1.0 / self.rs_high


@dataclass(frozen=True)
class Correction:
    """What :func:`correct` gives the update: per-token weights on the policy loss (None: no IS),
    the loss mask after rejection, and the ``correction/*`` metrics."""

    weights: Tensor | None  # [B, L] detached, 0 off the mask; None when is_level is none
    mask: Tensor  # [B, L] bool: the loss mask with rejected tokens removed
    metrics: dict[str, float]


def _row_log_ratio(lr: Tensor, m: Tensor, level: str) -> Tensor:
    """[B, 1]: sum (``sequence``) or mean (``geometric``) of the row's log-ratios over M."""
    return (masked_sum(lr, m, -1) if level == "sequence" else masked_mean(lr, m, -1))[:, None]


def correct(trainer: Tensor, engine: Tensor, mask: Tensor, settings: CorrectionSettings) -> Correction:
    """Truncated IS weights and the rejection mask of ``lr = trainer - engine`` (the module docstring).

    ``trainer`` [B, L]: log-probs the PPO ratio is anchored at (pi_old, or pi_prox with overlap 1);
    ``engine`` [B, L]: the sampling-time (behaviour) log-probs; ``mask`` [B, L]: the loss mask.
    Metrics: ``correction/is_mean`` (weights over M before truncation), ``is_max``,
    ``is_truncated_frac`` (tokens whose weight was cut at C), ``is_ess`` (effective sample size of
    the truncated weights / tokens: 1 = uniform), ``rejected_token_frac`` and ``rejected_row_frac``
    (of the rows with sampled tokens), ``veto_row_frac``.
    """
    m = mask.bool()
    lr = torch.where(m, trainer.float() - engine.float(), 0.0)
    metrics: dict[str, float] = {}
    weights = None
    if settings.is_level != "none":
        log_w = lr if settings.is_level == "token" else _row_log_ratio(lr, m, "sequence").expand_as(lr)
        raw = torch.exp(log_w.clamp(-SAFETY_BOUND, SAFETY_BOUND)) * m  # rho (token) or prod_t rho_t (row)
        weights = raw.clamp(max=settings.is_threshold).detach()  # min(., C)
        normed = weights / masked_mean(weights, m).clamp(min=1e-8)
        metrics.update({
            "correction/is_mean": float(masked_mean(raw, m)),
            "correction/is_max": float(raw[m].max()) if bool(m.any()) else 0.0,
            "correction/is_truncated_frac": float(masked_mean((raw > settings.is_threshold).float(), m)),
            "correction/is_ess": float(1.0 / masked_mean(normed**2, m).clamp(min=1e-12)) if bool(m.any()) else 0.0,
        })
    keep = m.clone()
    if settings.rs_level != "none":
        log_r = lr if settings.rs_level == "token" else _row_log_ratio(lr, m, settings.rs_level).expand_as(lr)
        r = torch.exp(log_r.clamp(-SAFETY_BOUND, SAFETY_BOUND))
        keep &= (r >= settings.low) & (r <= settings.rs_high)
    if settings.veto_threshold is not None:
        vetoed = ((lr < math.log(settings.veto_threshold)) & m).any(-1, keepdim=True)  # [B, 1]
        keep &= ~vetoed
        metrics["correction/veto_row_frac"] = float(vetoed[m.any(-1)].float().mean()) if bool(m.any()) else 0.0
    if settings.rs_level != "none" or settings.veto_threshold is not None:
        rows = m.any(-1)
        metrics["correction/rejected_token_frac"] = float(masked_mean((m & ~keep).float(), m))
        metrics["correction/rejected_row_frac"] = (float((m & ~keep).any(-1)[rows].float().mean())
                                                   if bool(rows.any()) else 0.0)
    return Correction(weights * keep if weights is not None else None, keep, metrics)
