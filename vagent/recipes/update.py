"""The policy-gradient update shared by PPO and GRPO, and PPO's critic update.

One loop, :func:`update_loop`, over PPO epochs x mini-batches x micro-batches, with the loss
passed in (:class:`ActorLoss`, :class:`CriticLoss`); :func:`actor_update` and
:func:`critic_update` are the two ways the recipes call it, each with the step's records whole
(``Scores``, ``Advantages``, ``OffPolicy`` of :mod:`vagent.recipes.stages`) and returning an
``UpdateStats``::

    for epoch in range(epochs):
        for rows in shuffled split of the batch into `mini_batches` parts (seeded by updates done, epoch):
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
from typing import TYPE_CHECKING, Callable, Generic, NamedTuple, Protocol, Sequence, TypeVar, overload

import torch
from torch import Tensor

from vagent.distributed import Padding, gather_metrics, rank_micro_batches
from vagent.recipes.batching import accumulation_weight, mini_batches
from vagent.runconfig import UpdateConfig
from vagent.recipes.optim import autocast, clip_grads, derive_seed
from vagent.recipes.scoring import critic_forward, policy_forward, shift_right
from vagent.recipes.stages import Advantages, OffPolicy, PPOAdvantages, PPOScores, Scores, UpdateStats
from vagent.rl.losses import aggregate, kl_penalty, ppo_policy_loss, value_loss
from vagent.rollout.batch import TokenBatch
from vagent.runs.errors import check_finite, check_module_finite

if TYPE_CHECKING:
    from vagent.models.value import ValueModel


@dataclass(frozen=True)
class UpdateContext:
    """Where and how an update runs (for error messages and determinism)."""

    device: torch.device
    bf16: bool
    seed: int
    #: updates done before this one (seeds the mini-batch order); this update makes RL step ``rl_step``
    updates_done: int
    #: the run's newest checkpoint, named by a NonFiniteError as the last good one
    last_checkpoint: str | None
    #: log-probs are of logits / temperature (the rollout's sampling temperature)
    temperature: float = 1.0

    @property
    def rl_step(self) -> int:
        """The RL step this update makes (1..steps), as metrics and errors name it."""
        return self.updates_done + 1


Module = TypeVar("Module", bound=torch.nn.Module)


@dataclass(frozen=True)
class Learner(Generic[Module]):
    """What an update trains: the module (the policy; the critic, a ``ValueModel``), the parameters
    it trains (all of them, or a shared critic's head) and their optimizer."""

    module: Module
    params: Sequence[torch.nn.Parameter]
    opt: torch.optim.Optimizer


@overload
def take(x: Tensor, rows: Sequence[int], length: int) -> Tensor: ...
@overload
def take(x: None, rows: Sequence[int], length: int) -> None: ...
def take(x: Tensor | None, rows: Sequence[int], length: int) -> Tensor | None:
    """Rows ``rows`` of a per-token tensor [B, L, ...], cut to ``length`` positions (as TokenBatch.select)."""
    if x is None:
        return None
    idx = torch.as_tensor(list(rows), device=x.device)
    return x.index_select(0, idx)[:, :length]


Inputs = TypeVar("Inputs", bound=tuple)  # a NamedTuple of per-token tensors (ActorInputs, CriticInputs)
_LossInputs = TypeVar("_LossInputs", bound=tuple, contravariant=True)


def take_all(inputs: Inputs, rows: Sequence[int], length: int) -> Inputs:
    """:func:`take` of every per-token tensor of a NamedTuple of them (None stays None)."""
    make: Callable[..., Inputs] = type(inputs)  # the NamedTuple's constructor, field by field
    return make(*(None if x is None else take(x, rows, length) for x in inputs))


class MicroLoss(NamedTuple):
    """One micro-batch's loss, as a loss function hands it to :func:`update_loop`."""

    loss: Tensor  # scalar, aggregated over the micro-batch with update.loss_agg
    checked: dict[str, Tensor]  # scalars that must be finite before the backward pass, by metric name
    stats: dict[str, float]  # logged; averaged with the micro-batch's accumulation weight


class LossFn(Protocol[_LossInputs]):
    """The loss :func:`update_loop` runs on each micro-batch, and the names its update goes by."""

    @property
    def role(self) -> str:
        """Prefix of the ``<role>/grad_norm`` metric: "actor" or "critic"."""

    @property
    def seed_tag(self) -> str:
        """The derive_seed stream of the mini-batch order: "mini" (actor) or "critic-mini"."""

    @property
    def trained(self) -> str:
        """What the finiteness check after the optimizer step names: "policy weights" or "critic weights"."""

    def __call__(self, mb: TokenBatch, inputs: _LossInputs, mask: Tensor) -> MicroLoss:
        """``inputs``: the micro-batch's rows of the per-token inputs [b, l]; ``mask`` [b, l] bool."""
        ...


class _Mean:
    """Weighted means of named statistics."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.shares: dict[str, float] = {}

    def add(self, values: dict[str, float], w: float) -> None:
        for k, v in values.items():
            self.sums[k] = self.sums.get(k, 0.0) + float(v) * w
            self.shares[k] = self.shares.get(k, 0.0) + w

    def result(self) -> dict[str, float]:
        """The means (over all ranks of a job: each rank added its micro-batches' global shares)."""
        return gather_metrics(self.sums, self.shares, "update stats")


@dataclass(frozen=True)
class _Shared:
    """What every mini-batch of one update shares."""

    learner: Learner
    loss: LossFn
    settings: UpdateConfig
    ctx: UpdateContext
    stats: _Mean


def update_loop(
    learner: Learner,
    batch: TokenBatch,
    inputs: Inputs,
    mask: Tensor,
    loss: LossFn[Inputs],
    settings: UpdateConfig,
    ctx: UpdateContext,
) -> dict[str, float]:
    """``settings.epochs`` x mini-batches x micro-batches of ``loss`` on ``batch`` (the module
    docstring), training ``learner`` (its module, parameters and optimizer).

    ``inputs``: a NamedTuple of per-token tensors [B, L, ...] (or None) aligned with
    ``batch.input_ids``, handed to ``loss`` cut to each micro-batch's rows; ``mask`` [B, L] bool:
    the positions the loss aggregates over, which set the micro-batches' accumulation weights.
    Returns the mean stats (``<role>/grad_norm`` over optimizer steps).
    """
    shared = _Shared(learner, loss, settings, ctx, _Mean())
    model = learner.module
    model.train()
    for epoch in range(settings.epochs):
        seed = derive_seed(ctx.seed, loss.seed_tag, ctx.updates_done, epoch)
        for rows in mini_batches(batch.batch_size, settings.mini_batches, seed):
            mini = batch.select(rows)
            length = mini.input_ids.shape[1]
            _mini_batch(shared, mini, take_all(inputs, rows, length), take(mask, rows, length))
    model.zero_grad(set_to_none=True)
    return shared.stats.result()


def _mini_batch(shared: _Shared, mini: TokenBatch, inputs: tuple, mask: Tensor) -> None:
    """Accumulate the gradient over this rank's micro-batches of ``mini``, then one optimizer step."""
    settings, learner = shared.settings, shared.learner
    where = ("rl", shared.ctx.rl_step, shared.ctx.last_checkpoint)  # errors name the RL step (1..steps)
    learner.module.zero_grad(set_to_none=True)
    for sub in rank_micro_batches(mini, settings.micro_batch_tokens):  # one process: all micro-batches
        mb = mini.select(sub)
        length = mb.input_ids.shape[1]
        mb_mask = take(mask, sub, length)
        w = 0.0 if isinstance(sub, Padding) else accumulation_weight(mb_mask, mask, settings.loss_agg)
        out = shared.loss(mb, take_all(inputs, sub, length), mb_mask)
        check_finite(out.checked, *where)
        (out.loss * w).backward()
        shared.stats.add(out.stats, w)
    grad_norm = clip_grads(learner.params, settings.grad_clip)
    check_finite({f"{shared.loss.role}/grad_norm": grad_norm}, *where)
    shared.stats.add({f"{shared.loss.role}/grad_norm": grad_norm}, 1.0)
    learner.opt.step()
    check_module_finite(learner.module, f"{shared.loss.trained} after the update", *where)


class ActorInputs(NamedTuple):
    """Per-token inputs of the actor loss, [B, L] aligned with the batch's tokens."""

    advantages: Tensor
    old_logprobs: Tensor
    ref_logprobs: Tensor | None  # None unless the KL penalty is in the loss
    is_weights: Tensor | None = None  # rollout-correction IS weights on the policy loss; None = 1


@dataclass(frozen=True)
class ActorLoss:
    """PPO-clip loss - entropy bonus (+ KL penalty) of one micro-batch (the module docstring)."""

    model: torch.nn.Module
    settings: UpdateConfig
    ctx: UpdateContext
    role: str = "actor"
    seed_tag: str = "mini"
    trained: str = "policy weights"

    def __call__(self, mb: TokenBatch, inputs: ActorInputs, mask: Tensor) -> MicroLoss:
        settings = self.settings
        with autocast(self.ctx.device, self.ctx.bf16):
            logp, ent = policy_forward(self.model, mb, settings.logprob_chunk, with_entropy=True,
                                       temperature=self.ctx.temperature, packed=settings.packing)
        assert ent is not None  # with_entropy=True
        pl = ppo_policy_loss(logp, inputs.old_logprobs, inputs.advantages, mask,
                             settings.clip_low, settings.clip_high, settings.dual_clip, settings.loss_agg,
                             weights=inputs.is_weights)
        entropy = aggregate(ent, mask, settings.loss_agg)
        loss = pl.loss - settings.entropy_coef * entropy
        stats = pl.metrics()
        stats["actor/entropy"] = float(entropy.detach())
        if inputs.ref_logprobs is not None:
            kl = aggregate(kl_penalty(logp, inputs.ref_logprobs, settings.kl_kind), mask, settings.loss_agg)
            loss = loss + settings.kl_coef * kl
            stats["actor/kl_loss"] = float(kl.detach())
        return MicroLoss(loss, {"loss/policy": pl.loss, "actor/entropy": entropy, "loss/actor_total": loss}, stats)


class CriticInputs(NamedTuple):
    """Per-token inputs of the critic loss, aligned with the batch's tokens."""

    old_values: Tensor  # [B, L]
    returns: Tensor  # [B, L]
    features: Tensor | None  # [B, L, H] backbone hidden states of a shared critic, else None


@dataclass(frozen=True)
class CriticLoss:
    """Clipped value regression of one micro-batch on the positions of its critic mask."""

    critic: ValueModel
    settings: UpdateConfig
    ctx: UpdateContext
    value_clip: float
    role: str = "critic"
    seed_tag: str = "critic-mini"
    trained: str = "critic weights"

    def __call__(self, mb: TokenBatch, inputs: CriticInputs, mask: Tensor) -> MicroLoss:
        with autocast(self.ctx.device, self.ctx.bf16):
            if inputs.features is not None:
                values = shift_right(self.critic.values_from_hidden(inputs.features))
            else:
                values = shift_right(critic_forward(self.critic, mb, self.settings.packing))
        # explained variance, a ratio of variances, is the whole batch's: the recipe computes it once
        vl = value_loss(values, inputs.old_values, inputs.returns, mask, clip=self.value_clip if self.value_clip > 0
                        else None, agg=self.settings.loss_agg)
        return MicroLoss(vl.loss, {"loss/value": vl.loss}, vl.metrics())


def actor_update(actor: Learner, batch: TokenBatch, scores: Scores, advantages: Advantages, off: OffPolicy,
                 settings: UpdateConfig, ctx: UpdateContext) -> UpdateStats:
    """PPO-clip update of the policy on ``batch`` (see the module docstring).

    Reads ``advantages.advantages`` [B, L]; from ``off`` the ratio's anchor [B, L], the rollout
    correction's IS weights on each token's policy loss (None = 1) and the loss mask [B, L] (M
    without the rejected tokens); the KL penalty is in the loss when ``scores.ref_logprobs`` is
    given, ``settings.kl_in == "loss"`` and ``settings.kl_coef > 0``.
    """
    ref = scores.ref_logprobs
    kl_in_loss = ref is not None and settings.kl_in == "loss" and settings.kl_coef > 0
    inputs = ActorInputs(advantages.advantages, off.anchor, ref if kl_in_loss else None, off.is_weights)
    loss = ActorLoss(actor.module, settings, ctx)
    return UpdateStats(update_loop(actor, batch, inputs, off.loss_mask, loss, settings, ctx))


def critic_update(critic: Learner[ValueModel], batch: TokenBatch, scores: PPOScores, advantages: PPOAdvantages,
                  settings: UpdateConfig, ctx: UpdateContext, value_clip: float) -> UpdateStats:
    """Clipped value regression of V_old (``scores.values``) toward ``advantages.returns`` on the
    positions of ``advantages.critic_mask`` [B, L] (values aligned with the tokens: shifted critic
    outputs, ``vagent.recipes.scoring.shift_right``). ``scores.features`` [B, L, H]: the backbone's
    hidden states from the scoring pass (``score_shared``) of a critic that shares the policy's
    backbone; the head then trains on them without a backbone forward (the same values: the
    backbone has not changed). ``value_clip``: ``ppo.value_clip`` (0: no clipping).
    """
    inputs = CriticInputs(scores.values, advantages.returns, scores.features)
    loss = CriticLoss(critic.module, settings, ctx, value_clip)
    return UpdateStats(update_loop(critic, batch, inputs, advantages.critic_mask, loss, settings, ctx))
