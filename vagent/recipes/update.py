"""The policy-gradient update shared by PPO and GRPO, and PPO's critic update.

Two functions, each a loop over PPO epochs x mini-batches x micro-batches::

    for epoch in range(epochs):
        for rows in shuffled split of the batch into `mini_batches` parts (seeded by step, epoch):
            zero grads
            for each micro-batch (rows x padded length <= micro_batch_tokens):
                forward -> loss (token-mean etc. over the micro-batch) -> (loss * w).backward()
                    w = the micro-batch's share of the mini-batch's loss tokens (or rows), so the
                    accumulated gradient equals the gradient of the loss over the whole mini-batch
            clip the gradient norm, check everything is finite, optimizer step

In a job of several ranks (torchrun), each rank runs the micro-batches of ITS share of each
mini-batch's rows (balanced by tokens), ``w`` stays the share of the whole mini-batch (a global
token mean), FSDP sums the gradients over ranks, and a rank with fewer micro-batches runs
zero-weight padding ones so that every rank joins every collective
(:func:`vagent.distributed.rank_micro_batches`).

Actor loss per micro-batch (docs/algorithms.md reference section 6)::

    loss = ppo_policy_loss(logp, old_logp, A, M, clip_low, clip_high, dual_clip, agg)
           - entropy_coef * aggregate(H, M)                        (entropy bonus)
           + kl_coef * aggregate(kl_penalty(logp, ref_logp), M)    (only when kl_in == "loss")

Critic loss: ``value_loss(V, V_old, R, critic_mask, clip)`` where ``critic_mask`` marks the
positions whose returns are defined (docs/algorithms.md reference bug 3).

A non-finite loss or gradient norm raises :class:`vagent.runs.NonFiniteError` BEFORE the optimizer
step, so the weights stay the last good ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch import Tensor

from vagent.distributed import Padding, gather_metrics, rank_micro_batches
from vagent.recipes.batching import accumulation_weight, mini_batches
from vagent.recipes.optim import autocast, clip_grads, derive_seed
from vagent.recipes.scoring import critic_forward, policy_forward, shift_right
from vagent.recipes.config import UpdateConfig
from vagent.runs.errors import check_finite, check_module_finite


@dataclass
class UpdateContext:
    """Where and how an update runs (for error messages and determinism)."""

    device: torch.device
    bf16: bool
    seed: int
    #: updates done before this one (seeds the mini-batch order); this update is RL step ``step + 1``
    step: int
    last_checkpoint: str | None
    #: log-probs are of logits / temperature (the rollout's sampling temperature)
    temperature: float = 1.0

    @property
    def label(self) -> int:
        """The RL step this update makes (1..steps), as metrics and errors name it."""
        return self.step + 1


def take(x: Tensor | None, rows: Sequence[int], length: int) -> Tensor | None:
    """Rows ``rows`` of a per-token tensor [B, L], cut to ``length`` positions (as TokenBatch.select)."""
    if x is None:
        return None
    idx = torch.as_tensor(list(rows), device=x.device)
    return x.index_select(0, idx)[:, :length]


class _Mean:
    """Weighted means of named statistics."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.weights: dict[str, float] = {}

    def add(self, values: dict[str, float], w: float) -> None:
        for k, v in values.items():
            self.sums[k] = self.sums.get(k, 0.0) + float(v) * w
            self.weights[k] = self.weights.get(k, 0.0) + w

    def result(self) -> dict[str, float]:
        """The means (over all ranks of a job: each rank added its micro-batches' global shares)."""
        return gather_metrics(self.sums, self.weights, "update stats")


def actor_update(
    model: torch.nn.Module,
    params: Sequence[torch.nn.Parameter],
    opt: torch.optim.Optimizer,
    batch: Any,
    advantages: Tensor,
    old_logprobs: Tensor,
    ref_logprobs: Tensor | None,
    u: UpdateConfig,
    ctx: UpdateContext,
) -> dict[str, float]:
    """PPO-clip update of the policy on ``batch`` (see the module docstring); returns mean stats.

    Shapes: advantages, old_logprobs, ref_logprobs [B, L] aligned with ``batch.input_ids``.
    """
    from vagent.rl.losses import aggregate, kl_penalty, ppo_policy_loss

    stats = _Mean()
    kl_in_loss = ref_logprobs is not None and u.kl_in == "loss" and u.kl_coef > 0
    model.train()
    for epoch in range(u.epochs):
        for rows in mini_batches(batch.batch_size, u.mini_batches, derive_seed(ctx.seed, "mini", ctx.step, epoch)):
            mini = batch.select(rows)
            L = mini.input_ids.shape[1]
            m_adv, m_old, m_ref = take(advantages, rows, L), take(old_logprobs, rows, L), take(ref_logprobs, rows, L)
            model.zero_grad(set_to_none=True)
            for sub in rank_micro_batches(mini, u.micro_batch_tokens):  # one process: all micro-batches
                mb = mini.select(sub)
                ml = mb.input_ids.shape[1]
                M = mb.loss_mask
                w = 0.0 if isinstance(sub, Padding) else accumulation_weight(M, mini.loss_mask, u.loss_agg)
                with autocast(ctx.device, ctx.bf16):
                    logp, ent = policy_forward(model, mb, u.logprob_chunk, with_entropy=True,
                                              temperature=ctx.temperature)
                pl = ppo_policy_loss(logp, take(m_old, sub, ml), take(m_adv, sub, ml), M,
                                     u.clip_low, u.clip_high, u.dual_clip, u.loss_agg)
                entropy = aggregate(ent, M, u.loss_agg)
                loss = pl.loss - u.entropy_coef * entropy
                values = pl.metrics()
                values["actor/entropy"] = float(entropy.detach())
                if kl_in_loss:
                    kl = aggregate(kl_penalty(logp, take(m_ref, sub, ml), u.kl_kind), M, u.loss_agg)
                    loss = loss + u.kl_coef * kl
                    values["actor/kl_loss"] = float(kl.detach())
                check_finite({"loss/policy": pl.loss, "actor/entropy": entropy, "loss/actor_total": loss},
                             "rl", ctx.label, ctx.last_checkpoint)
                (loss * w).backward()
                stats.add(values, w)
            grad_norm = clip_grads(params, u.grad_clip)
            check_finite({"actor/grad_norm": grad_norm}, "rl", ctx.label, ctx.last_checkpoint)
            stats.add({"actor/grad_norm": grad_norm}, 1.0)
            opt.step()
            check_module_finite(model, "policy weights after the update", "rl", ctx.label, ctx.last_checkpoint)
    model.zero_grad(set_to_none=True)
    return stats.result()


def critic_update(
    critic: torch.nn.Module,
    params: Sequence[torch.nn.Parameter],
    opt: torch.optim.Optimizer,
    batch: Any,
    old_values: Tensor,
    returns: Tensor,
    critic_mask: Tensor,
    u: UpdateConfig,
    value_clip: float,
    ctx: UpdateContext,
    features: Tensor | None = None,
) -> dict[str, float]:
    """Clipped value regression on the positions of ``critic_mask`` [B, L]; returns mean stats.

    old_values, returns [B, L] are aligned with the tokens (shifted critic outputs, see
    ``vagent.recipes.scoring.shift_right``). ``features`` [B, L, H]: the backbone's hidden states from the
    scoring pass (``score_shared``) of a critic that shares the policy's backbone; the head then
    trains on them without a backbone forward (the same values: the backbone has not changed).
    """
    from vagent.rl.losses import value_loss

    stats = _Mean()
    critic.train()
    for epoch in range(u.epochs):
        for rows in mini_batches(batch.batch_size, u.mini_batches, derive_seed(ctx.seed, "critic-mini", ctx.step, epoch)):
            mini = batch.select(rows)
            L = mini.input_ids.shape[1]
            m_old, m_ret, m_mask = take(old_values, rows, L), take(returns, rows, L), take(critic_mask, rows, L)
            m_feat = take(features, rows, L)
            critic.zero_grad(set_to_none=True)
            for sub in rank_micro_batches(mini, u.micro_batch_tokens):  # one process: all micro-batches
                mb = mini.select(sub)
                ml = mb.input_ids.shape[1]
                mask = take(m_mask, sub, ml)
                w = 0.0 if isinstance(sub, Padding) else accumulation_weight(mask, m_mask, u.loss_agg)
                with autocast(ctx.device, ctx.bf16):
                    if m_feat is not None:
                        v = shift_right(critic.values_from_hidden(take(m_feat, sub, ml)))
                    else:
                        v = shift_right(critic_forward(critic, mb))
                vl = value_loss(v, take(m_old, sub, ml), take(m_ret, sub, ml), mask,
                                clip=value_clip if value_clip > 0 else None, agg=u.loss_agg)
                check_finite({"loss/value": vl.loss}, "rl", ctx.label, ctx.last_checkpoint)
                (vl.loss * w).backward()
                metrics = vl.metrics()
                metrics.pop("loss/explained_variance")  # a ratio of variances: computed on the batch below
                stats.add(metrics, w)
            grad_norm = clip_grads(params, u.grad_clip)
            check_finite({"critic/grad_norm": grad_norm}, "rl", ctx.label, ctx.last_checkpoint)
            stats.add({"critic/grad_norm": grad_norm}, 1.0)
            opt.step()
            check_module_finite(critic, "critic weights after the update", "rl", ctx.label, ctx.last_checkpoint)
    critic.zero_grad(set_to_none=True)
    return stats.result()
