"""The typed records an RL step hands from stage to stage (torchtune's ``GRPOTrajectory`` manner).

One RL step of ``ppo.py`` / ``grpo.py`` reads::

    episodes  = loop.rollout(step)                    rollout      -> RolloutResult (list of Episode)
    batch     = token_batch(session, episodes)        token rows   -> TokenBatch [B, L]
    scores    = score_batch(...)                      scoring      -> Scores (PPO: PPOScores, with V_old)
    estimate  = ppo_advantages / group_advantages     advantages   -> Advantages (PPO: PPOAdvantages)
    off       = off_policy(cfg, batch, scores, ...)   mismatch     -> OffPolicy (ratio anchor, IS weights, rejections)
    stats     = critic_update(...), actor_update(...) update       -> UpdateStats (loss/ actor/ critic/ metrics)
    outcome   = StepOutcome(step=..., ...)            log, save    -> after_step (``vagent.recipes.step``)

Each record is passed whole: a stage takes the records it reads, not their fields one by one.
What only PPO has (a critic's values and targets) is in PPO's records, which extend the shared
ones by fields (no methods are inherited). Every tensor is [B, L] (rows x positions of the
``TokenBatch``) unless its comment says otherwise; ``M`` is the batch's ``loss_mask`` (1 on the
tokens the policy sampled). The [B] trajectory returns (sum of turn rewards) that GRPO's
estimators and the reward filter read are the batch's own (``TokenBatch.episode_returns``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from torch import Tensor

from vagent.runs import load_checkpoint

if TYPE_CHECKING:
    import torch

    from vagent.rollout.batch import TokenBatch
    from vagent.rollout.finish import RolloutResult


@dataclass(frozen=True)
class Scores:
    """What the no-grad scoring passes give every RL step (``vagent.recipes.scoring.score_batch``)."""

    old_logprobs: Tensor  # log pi_old of each token, the trainer's forward at the rollout temperature
    ref_logprobs: Tensor | None  # log pi_ref; None without a KL term (update.kl_coef 0)


@dataclass(frozen=True)
class PPOScores(Scores):
    """PPO's scores: those of every step and the critic's (``score_batch`` with a critic)."""

    values: Tensor  # V before each sampled token (critic shifted right, x M)
    final_values: Tensor  # [B] V(final observation) of truncated rows, 0 on the others
    features: Tensor | None = None  # [B, L, H] a shared critic's backbone features for its head's update


@dataclass(frozen=True)
class Advantages:
    """The advantage stage of every RL step (``ppo.ppo_advantages``, ``grpo.group_advantages``)."""

    advantages: Tensor  # what the actor trains on, on M, x the reward filter's scale (PPO: whitened over M)
    kl_ref: float | None  # mean per-token KL to the reference over M (actor/kl_ref); None: no reference


@dataclass(frozen=True)
class PPOAdvantages(Advantages):
    """PPO's advantage stage: also the critic's targets."""

    raw: Tensor  # the estimator's advantages before whitening (logged as critic/advantage_*)
    returns: Tensor  # the critic's targets, defined on critic_mask
    critic_mask: Tensor  # where the value loss trains: M, turn ends (turn_gae) or anchors (no_concat_gae)


@dataclass(frozen=True)
class OffPolicy:
    """How the update treats the gap between the engine that sampled the batch and the trainer
    (``vagent.recipes.step.off_policy``): what the PPO ratio is taken against, the rollout
    correction's weights and rejections, and the ``mismatch/`` and ``correction/`` metrics."""

    anchor: Tensor  # log-probs the PPO ratio is taken against: log pi_old (or the behaviour's, overlap 1 uncorrected)
    weights: Tensor | None  # truncated IS weights on the policy loss (rollout_correction.is_level); None = 1
    loss_mask: Tensor  # M without the rejected tokens (rollout_correction.rs_level / veto_threshold)
    metrics: dict[str, float]


@dataclass(frozen=True)
class UpdateStats:
    """The mean statistics of one update, actor's or critic's (``vagent.recipes.update``), by the
    names they are logged under (docs/metrics.md): the loss and gradient norm by name here, every
    statistic in ``metrics``."""

    role: str  # "actor" or "critic"
    loss: float  # loss/policy or loss/value: the mean over micro-batches, weighted by their share
    grad_norm: float  # <role>/grad_norm: the mean over optimizer steps, before clipping
    metrics: dict[str, float]  # loss/ actor/ or critic/ statistics, loss and grad_norm included


@dataclass(frozen=True)
class StepOutcome:
    """What RL step ``step`` hands to logging, samples and checkpointing (``step.after_step``)."""

    step: int  # RL steps done, this one included (1..steps)
    metrics: dict[str, float]  # the step's record in metrics.jsonl
    episodes: RolloutResult  # the episodes of the rollout (the errored ones included)
    batch: TokenBatch  # the batch the update trained on (after the filter)
    scores: Scores  # its scoring passes (PPOScores: with the critic's values; features dropped)
    advantages: Advantages  # its advantages (PPOAdvantages: with the critic's returns)


@dataclass
class TrainState:
    """What a checkpoint saves and ``--resume`` loads, by name: ``policy`` / ``critic`` modules,
    ``actor`` / ``critic`` optimizers and their learning-rate schedules."""

    modules: dict[str, torch.nn.Module]
    optimizers: dict[str, torch.optim.Optimizer]
    schedulers: dict[str, torch.optim.lr_scheduler.LRScheduler]

    def load(self, checkpoint: str) -> None:
        """Restore every module, optimizer and schedule from ``checkpoint`` (a resume)."""
        load_checkpoint(checkpoint, self.modules, self.optimizers, self.schedulers)


@dataclass
class StepClock:
    """The three times a step's perf/ metrics use: its start, the update's start and the end."""

    start: float = field(default_factory=time.perf_counter)
    update: float = 0.0
    end: float = 0.0

    def update_starts(self) -> None:
        self.update = time.perf_counter()

    def stop(self) -> None:
        self.end = time.perf_counter()

    @property
    def step_s(self) -> float:
        return self.end - self.start

    @property
    def update_s(self) -> float:
        return self.end - self.update
