"""Numerical core of training: advantage estimators, losses and group filters.

Pure tensor functions (CPU or GPU, float32 or bf16 in, float32 out), each with its formula, paper
and shapes in the docstring. The math and the choices are summarised in docs/algorithms.md.
"""

from vagent.rl.advantages import (
    anchor_mask,
    bi_level_gae,
    masked_gae,
    masked_mean,
    masked_sum,
    masked_whiten,
    no_concat_gae,
    turn_gae,
)
from vagent.rl.group_advantages import gigpo_advantages, grpo_advantages, reinforce_pp_advantages, rloo_advantages
from vagent.rl.filters import FilterResult, variance_filter
from vagent.rl.losses import (
    AGG_MODES,
    KL_KINDS,
    PolicyLoss,
    ValueLoss,
    aggregate,
    entropy_from_logits,
    kl_penalty,
    logprobs_from_logits,
    ppo_policy_loss,
    value_loss,
)

__all__ = [
    "AGG_MODES",
    "KL_KINDS",
    "FilterResult",
    "PolicyLoss",
    "ValueLoss",
    "aggregate",
    "anchor_mask",
    "bi_level_gae",
    "entropy_from_logits",
    "gigpo_advantages",
    "grpo_advantages",
    "kl_penalty",
    "logprobs_from_logits",
    "masked_gae",
    "masked_mean",
    "masked_sum",
    "masked_whiten",
    "no_concat_gae",
    "ppo_policy_loss",
    "reinforce_pp_advantages",
    "rloo_advantages",
    "turn_gae",
    "value_loss",
    "variance_filter",
]
