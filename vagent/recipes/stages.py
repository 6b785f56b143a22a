"""The typed records an RL step hands from stage to stage (torchtune's ``GRPOTrajectory`` manner),
and the stages PPO and GRPO run alike on them (``token_batch``, ``filter_groups``,
``reference_kl``, ``off_policy``).

One RL step of ``ppo.py`` / ``grpo.py`` reads::

    episodes  = loop.rollout(updates_done)            rollout      -> RolloutResult (list of Episode)
    kept      = filter_groups(token_batch(...), ...)  token rows   -> Filtered (TokenBatch [B, L], scale, filter/)
    scores    = score_batch(...)                      scoring      -> Scores (PPO: PPOScores, with V_old)
    estimate  = ppo_advantages / group_advantages     advantages   -> Advantages (PPO: PPOAdvantages)
    off       = off_policy(...)                       mismatch     -> OffPolicy (ratio anchor, IS weights, rejections)
    stats     = critic_update(...), actor_update(...) update       -> UpdateStats (loss/ actor/ critic/ metrics)
    outcome   = StepOutcome(rl_step=..., ...)         log, save    -> StepLoop.finish (``vagent.recipes.step``)

Each record is passed whole: a stage takes the records it reads, not their fields one by one.
What only PPO has (a critic's values and targets) is in PPO's records, which extend the shared
ones by fields (no methods are inherited). Every tensor is [B, L] (rows x positions of the
``TokenBatch``) unless its comment says otherwise; ``M`` is the batch's ``loss_mask`` (1 on the
tokens the policy sampled). The [B] trajectory returns (sum of turn rewards) that GRPO's
estimators and the reward filter read are the batch's own (``TokenBatch.episode_returns``).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from vagent.rl.correction import CorrectionSettings, correct, k3_kl, mismatch_metrics
from vagent.rl.filters import variance_filter
from vagent.rl.losses import kl_penalty
from vagent.rollout.batch import NoTrainableEpisodesError, TokenBatch, build_token_batch
from vagent.runs import load_checkpoint
from vagent.runs.errors import TrainingError

if TYPE_CHECKING:
    from vagent.runconfig import GRPOConfig, PPOConfig, RunConfig, UpdateConfig
    from vagent.rollout.finish import RolloutResult


@dataclass(frozen=True)
class Filtered:
    """The token batch after the reward-variance filter (:func:`filter_groups`)."""

    batch: TokenBatch  # the kept rows (all of them with ``filter: none``)
    scale: float  # the advantages' scale (top_p: sqrt(kept / all groups)); 1.0 otherwise
    metrics: dict[str, float]  # filter/* ({} with ``filter: none``)


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
    (:func:`off_policy`): what the PPO ratio is taken against, the rollout
    correction's weights and rejections, and the ``mismatch/`` and ``correction/`` metrics."""

    anchor: Tensor  # log-probs the PPO ratio is taken against: log pi_old (or the behaviour's, overlap 1 uncorrected)
    is_weights: Tensor | None  # truncated IS weights on the policy loss (rollout_correction.is_level); None = 1
    loss_mask: Tensor  # M without the rejected tokens (rollout_correction.rs_level / veto_threshold)
    metrics: dict[str, float]


@dataclass(frozen=True)
class UpdateStats:
    """The mean statistics of one update, actor's or critic's (``vagent.recipes.update``), by the
    names they are logged under (docs/metrics.md): ``loss/policy`` or ``loss/value``,
    ``<role>/grad_norm`` (the mean over optimizer steps, before clipping) and the loss's others."""

    metrics: dict[str, float]


@dataclass(frozen=True)
class StepOutcome:
    """What RL step ``rl_step`` hands to the step's tail (``StepLoop.finish``: log, validate, save,
    checkpoint): the step's records whole, the stages' metrics in the order they are logged
    (``vagent.recipes.step.step_metrics`` merges them, in that one place) and what only the recipe
    knows."""

    rl_step: int  # RL steps done, this one included (1..steps)
    episodes: RolloutResult  # the episodes of the rollout (the errored ones included)
    batch: TokenBatch  # the batch the update trained on (after the filter)
    scores: Scores  # its scoring passes (PPOScores: with the critic's values; features dropped)
    advantages: Advantages  # its advantages (PPOAdvantages: with the critic's returns)
    clock: StepClock  # stopped after the update
    #: filter/, mismatch/ and correction/, the updates' loss/ actor/ critic/, optim/ (in this order)
    stage_metrics: tuple[dict[str, float], ...]
    own: dict[str, float]  # the recipe's own metrics (PPO's critic/, GRPO's actor/advantage_abs_mean)
    backbones: int  # backbone passes of the update per token and epoch (perf/update_tokens_per_s)
    values: Tensor | None = None  # V_old shown beside each token of the saved token rows (PPO); None
    returns: Tensor | None = None  # the critic's targets shown there (PPO); None
    shown: dict[str, str] = field(default_factory=dict)  # the recipe's progress-bar fields (PPO: actor=...)


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


# --- the stages both recipes run alike -------------------------------------------------------


@dataclass(frozen=True)
class BatchLayout:
    """How episodes become the token batch (``token_batch``): the rows' layout
    (``batch_mode``), the padding id and the device."""

    mode: str
    pad_token_id: int
    device: torch.device


def token_batch(episodes: RolloutResult, layout: BatchLayout) -> TokenBatch:
    """The episodes' token rows (concat / window / no_concat, as configured) on the run's device;
    TrainingError (one line, naming the episodes' error) when no episode can be trained on."""
    try:
        return build_token_batch(episodes, mode=layout.mode, pad_token_id=layout.pad_token_id).to(layout.device)
    except NoTrainableEpisodesError as exc:
        raise TrainingError(str(exc)) from exc


def trajectory_rows(batch: TokenBatch) -> tuple[Tensor, Tensor]:
    """(row_traj [B]: each row's trajectory slot, first [T]: the first row of each trajectory), the
    T trajectories in ``traj_id`` order: what reads one value per trajectory off the rows (its
    return, its group) and broadcasts one back (``row_traj``)."""
    trajs, row_traj = torch.unique(batch.traj_ids, return_inverse=True)  # [T], [B] -> trajectory slot
    first = torch.full((trajs.numel(),), batch.batch_size, dtype=torch.long, device=row_traj.device)
    first = first.scatter_reduce(0, row_traj, torch.arange(batch.batch_size, device=row_traj.device), "amin")
    return row_traj, first


def filter_groups(batch: TokenBatch, settings: GRPOConfig | PPOConfig) -> Filtered:
    """The reward-variance filter ``settings.filter`` / ``filter_value`` (the recipe's: ``cfg.grpo``
    or ``cfg.ppo``) over the groups' trajectory returns (``batch.episode_returns``): the kept
    rows, the advantage scale and the filter/* metrics."""
    if settings.filter == "none":
        return Filtered(batch, 1.0, {})
    row_traj, first = trajectory_rows(batch)
    result = variance_filter(batch.episode_returns[first], batch.group_ids[first], settings.filter,
                             settings.filter_value)
    keep_traj = torch.zeros(first.numel(), dtype=torch.bool, device=row_traj.device)
    keep_traj[result.kept_indices.to(row_traj.device)] = True
    rows = keep_traj[row_traj].nonzero()[:, 0]
    return Filtered(batch.select(rows), result.scale, result.metrics)


def reference_kl(scores: Scores, M: Tensor, settings: UpdateConfig) -> Tensor | None:
    """[B, L] the per-token KL of pi_old to the reference (``update.kl_kind``) on M (0 elsewhere), or
    None without a reference model: PPO puts it in the rewards (``update.kl_in: reward``); both
    recipes log its mean over M (``actor/kl_ref``)."""
    if scores.ref_logprobs is None:
        return None
    return kl_penalty(scores.old_logprobs, scores.ref_logprobs, settings.kl_kind) * M


def image_context(batch: TokenBatch, image_token_id: int | None) -> Tensor:
    """[B, L] bool: whether an image is in the context of each position (an image placeholder at or
    before it in its row); without a known placeholder id, whether the row has an image at all."""
    if image_token_id is None:
        return (batch.n_images > 0)[:, None].expand_as(batch.input_ids)
    return (batch.input_ids == image_token_id).long().cumsum(1) > 0


def off_policy(cfg: RunConfig, batch: TokenBatch, scores: Scores, image_token_id: int | None = None) -> OffPolicy:
    """The engine/trainer gap of a batch and what the update does about it (docs/algorithms.md
    "Rollout correction"): ``batch.old_logprobs`` are the engine's sampling-time log-probs,
    ``scores.old_logprobs`` the trainer's of the same tokens.

    - ``rollout.overlap: 0``: both are at the same weights, so their gap is the engines' numerics
      (or a bad push): ``mismatch/*`` (all tokens, and split by image in context). The ratio is
      taken against log pi_old (the trainer's).
    - ``rollout.overlap: 1``: the batch was sampled one update ago: ``mismatch/staleness`` is logged
      by the driver, ``mismatch/behaviour_proximal_kl`` here; without a correction the ratio is
      taken against the behaviour (sampling-time) log-probs, as before.
    - ``rollout_correction`` on: the ratio is taken against the trainer's log-probs (the proximal
      policy with overlap 1: decoupled PPO), times the truncated IS weights, without the rejected
      tokens (``vagent.rl.correction.correct``).
    - ``rollout.max_staleness >= 1`` (streaming: a batch mixes versions 0..K updates old): decoupled
      PPO always; without a correction set, token-level truncated IS at
      ``rollout_correction.is_threshold`` (AReaL's behaviour weight ``min(pi_prox / pi_behav, C)``).
    """
    engine, trainer, M = batch.old_logprobs, scores.old_logprobs, batch.loss_mask
    stale = bool(cfg.rollout.overlap or cfg.rollout.max_staleness)
    if stale:
        metrics = {"mismatch/behaviour_proximal_kl": k3_kl(trainer, engine, M)}
    else:
        metrics = mismatch_metrics(trainer, engine, M, image_context(batch, image_token_id))
    settings = CorrectionSettings(**asdict(cfg.rollout_correction))
    if cfg.rollout.max_staleness and not settings.active:
        settings = replace(settings, is_level="token")
    if not settings.active:
        anchor = engine * M if cfg.rollout.overlap else trainer
        return OffPolicy(anchor, None, M, metrics)
    fix = correct(trainer, engine, M, settings)
    return OffPolicy(trainer, fix.weights, fix.mask, metrics | fix.metrics)
