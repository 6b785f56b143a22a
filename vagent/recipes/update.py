"""The policy-gradient update shared by PPO and GRPO, and PPO's critic update.

One loop, :class:`Update`, over PPO epochs x mini-batches x micro-batches; :func:`actor_update` and
:func:`critic_update` iterate it and call their loss (:func:`actor_loss`, :func:`critic_loss`) on
each micro-batch themselves, each with the step's records whole (``Scores``, ``Advantages``,
``OffPolicy`` of :mod:`vagent.recipes.stages`) and returning an ``UpdateStats``::

    update = Update(learner, batch, mask, settings, ctx, ACTOR)
    for micro in update:                      # the loop below, one micro-batch at a time
        update.backward(micro, actor_loss(model, micro.batch, micro.take(inputs), micro.mask, ...))

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
from typing import TYPE_CHECKING, Callable, Generic, Iterator, NamedTuple, Sequence, TypeVar, overload

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


def take_all(inputs: Inputs, rows: Sequence[int], length: int) -> Inputs:
    """:func:`take` of every per-token tensor of a NamedTuple of them (None stays None)."""
    make: Callable[..., Inputs] = type(inputs)  # the NamedTuple's constructor, field by field
    return make(*(None if x is None else take(x, rows, length) for x in inputs))


class MicroLoss(NamedTuple):
    """One micro-batch's loss, as :meth:`Update.backward` takes it."""

    loss: Tensor  # scalar, aggregated over the micro-batch with update.loss_agg
    checked: dict[str, Tensor]  # scalars that must be finite before the backward pass, by metric name
    stats: dict[str, float]  # logged; averaged with the micro-batch's accumulation weight


@dataclass(frozen=True)
class Role:
    """The names an update goes by."""

    name: str  #: prefix of the ``<name>/grad_norm`` metric
    seed_tag: str  #: the derive_seed stream of the mini-batch order
    trained: str  #: what the finiteness check after the optimizer step names


ACTOR = Role("actor", "mini", "policy weights")
CRITIC = Role("critic", "critic-mini", "critic weights")


@dataclass(frozen=True)
class MicroBatch:
    """One micro-batch of an update: its rows of the batch, the loss positions, its accumulation weight."""

    batch: TokenBatch  # the micro-batch's rows, cut to their longest
    rows: Sequence[int]  # their indices in the update's whole batch
    mask: Tensor  # [b, l] bool: the positions the loss aggregates over
    weight: float  # share of the mini-batch's loss tokens (or rows); 0 for a rank's padding micro-batch

    def take(self, inputs: Inputs) -> Inputs:
        """The micro-batch's rows of per-token inputs [B, L, ...] aligned with the whole batch."""
        return take_all(inputs, self.rows, self.batch.input_ids.shape[1])


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


class Update:
    """One update of ``learner`` on ``batch``: iterating it gives ``settings.epochs`` x mini-batches x
    this rank's micro-batches (the module docstring), and the caller computes each one's loss and
    hands it to :meth:`backward`; after a mini-batch's last micro-batch the gradient is clipped,
    checked and the optimizer steps. ``mask`` [B, L] bool: the positions the loss aggregates over,
    which set the micro-batches' accumulation weights. :meth:`stats`: the mean stats afterwards
    (``<role>/grad_norm`` over optimizer steps)."""

    def __init__(self, learner: Learner, batch: TokenBatch, mask: Tensor, settings: UpdateConfig,
                 ctx: UpdateContext, role: Role) -> None:
        self.learner, self.batch, self.mask, self.settings, self.ctx, self.role = learner, batch, mask, settings, ctx, role
        self._stats = _Mean()
        self._waiting: MicroBatch | None = None  # yielded, its loss not yet given to backward
        self._where = ("rl", ctx.rl_step, ctx.last_checkpoint)  # errors name the RL step (1..steps)

    def __iter__(self) -> Iterator[MicroBatch]:
        settings, module = self.settings, self.learner.module
        module.train()
        for epoch in range(settings.epochs):
            seed = derive_seed(self.ctx.seed, self.role.seed_tag, self.ctx.updates_done, epoch)
            for rows in mini_batches(self.batch.batch_size, settings.mini_batches, seed):
                mini = self.batch.select(rows)
                mini_mask = take(self.mask, rows, mini.input_ids.shape[1])
                module.zero_grad(set_to_none=True)
                for sub in rank_micro_batches(mini, settings.micro_batch_tokens):  # one process: all of them
                    mb = mini.select(sub)
                    mb_mask = take(mini_mask, sub, mb.input_ids.shape[1])
                    w = 0.0 if isinstance(sub, Padding) else accumulation_weight(mb_mask, mini_mask, settings.loss_agg)
                    self._waiting = MicroBatch(mb, [rows[i] for i in sub], mb_mask, w)
                    yield self._waiting
                    if self._waiting is not None:
                        raise RuntimeError(f"{self.role.name} update: the loop moved past a micro-batch whose loss was "
                                           "not given to Update.backward(micro, loss); call it once per micro-batch")
                self._optimizer_step()
        module.zero_grad(set_to_none=True)

    def backward(self, micro: MicroBatch, out: MicroLoss) -> None:
        """Check ``out``'s values are finite, then accumulate the gradient of ``out.loss`` x the
        micro-batch's weight and its stats."""
        if micro is not self._waiting:
            raise RuntimeError(f"{self.role.name} update: backward got a micro-batch that is not the one the loop "
                               "is at; give each micro-batch's loss once, inside the `for micro in update` loop")
        check_finite(out.checked, *self._where)
        (out.loss * micro.weight).backward()
        self._stats.add(out.stats, micro.weight)
        self._waiting = None

    def _optimizer_step(self) -> None:
        learner, name = self.learner, f"{self.role.name}/grad_norm"
        grad_norm = clip_grads(learner.params, self.settings.grad_clip)
        check_finite({name: grad_norm}, *self._where)
        self._stats.add({name: grad_norm}, 1.0)
        learner.opt.step()
        check_module_finite(learner.module, f"{self.role.trained} after the update", *self._where)

    def stats(self) -> dict[str, float]:
        """The update's mean stats (over all ranks of a job)."""
        return self._stats.result()


class ActorInputs(NamedTuple):
    """Per-token inputs of the actor loss, [B, L] aligned with the batch's tokens."""

    advantages: Tensor
    old_logprobs: Tensor
    ref_logprobs: Tensor | None  # None unless the KL penalty is in the loss
    is_weights: Tensor | None = None  # rollout-correction IS weights on the policy loss; None = 1


def actor_loss(model: torch.nn.Module, mb: TokenBatch, inputs: ActorInputs, mask: Tensor, settings: UpdateConfig,
               ctx: UpdateContext) -> MicroLoss:
    """PPO-clip loss - entropy bonus (+ KL penalty) of one micro-batch (the module docstring):
    ``inputs`` are the micro-batch's rows [b, l], ``mask`` [b, l] bool its loss positions."""
    with autocast(ctx.device, ctx.bf16):
        logp, ent = policy_forward(model, mb, settings.logprob_chunk, with_entropy=True,
                                   temperature=ctx.temperature, packed=settings.packing)
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


def critic_loss(critic: ValueModel, mb: TokenBatch, inputs: CriticInputs, mask: Tensor, settings: UpdateConfig,
                ctx: UpdateContext, value_clip: float) -> MicroLoss:
    """Clipped value regression of one micro-batch on the positions of its critic mask ``mask``."""
    with autocast(ctx.device, ctx.bf16):
        if inputs.features is not None:
            values = shift_right(critic.values_from_hidden(inputs.features))
        else:
            values = shift_right(critic_forward(critic, mb, settings.packing))
    # explained variance, a ratio of variances, is the whole batch's: the recipe computes it once
    vl = value_loss(values, inputs.old_values, inputs.returns, mask, clip=value_clip if value_clip > 0 else None,
                    agg=settings.loss_agg)
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
    update = Update(actor, batch, off.loss_mask, settings, ctx, ACTOR)
    for micro in update:
        update.backward(micro, actor_loss(actor.module, micro.batch, micro.take(inputs), micro.mask, settings, ctx))
    return UpdateStats(update.stats())


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
    update = Update(critic, batch, advantages.critic_mask, settings, ctx, CRITIC)
    for micro in update:
        update.backward(micro, critic_loss(critic.module, micro.batch, micro.take(inputs), micro.mask, settings, ctx,
                                           value_clip))
    return UpdateStats(update.stats())
