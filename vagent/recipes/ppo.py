"""PPO with a critic for multi-turn VLM agents (VAGEN, arXiv 2510.16907), as one readable loop.

Each RL step, in the order it runs::

    1. rollout     n_train envs x group_size episodes (seeds from (run seed, step)), sampled
    2. rewards     each turn's reward (env + reasoning judges) on its last sampled token e_k;
                   optional reward-variance filter over groups (ppo.filter, as grpo.filter)
    3. scoring     no-grad passes: log pi_old, V_old (critic), log pi_ref (if KL); KL in reward
    4. advantages  masked_gae | bi_level_gae | turn_gae | no_concat_gae, then whitened over M;
                   the engine/trainer gap (mismatch/*) and the rollout correction (step.off_policy)
    5. update      critic: clipped value loss where returns are defined; actor: PPO-clip +
                   entropy bonus (+ KL in loss); epochs x mini-batches x micro-batches
    6. log         rollout/ reward/ loss/ actor/ critic/ optim/ perf/; validation (greedy, val
                   split) every val.every steps; samples, checkpoint, plots
    (validation also before the first step: step 0 is the policy after SFT)

Steps are counted as updates done: the loop's k-th update is RL step k (1..steps), and its
metrics, rollouts and checkpoint carry k (docs/metrics.md, "Steps"). Seeds of the rollout and of
the mini-batch order are functions of (run seed, k - 1).

How it departs from VAGEN / the paper:

- ``log pi_old`` is recomputed with the training forward pass before the update instead of using
  the sampling-time log-probs, so the first PPO ratio is exactly 1 (the two differ by kernel and
  padding numerics; the mean absolute difference is logged as ``actor/logprob_diff``, the gap in
  full as ``mismatch/*``). ``rollout_correction`` weights (truncated IS) or rejects tokens by
  pi_trainer / pi_engine, as verl's rollout_corr (docs/algorithms.md "Rollout correction").
- Truncated episodes (turn limit) bootstrap from V(final observation) (docs/algorithms.md reference bug 4);
  legacy VAGEN never bootstrapped.
- The critic trains only where returns are defined (docs/algorithms.md reference bug 3): every sampled token for
  masked/bi-level GAE, turn ends for turn_gae, the anchor token for no_concat_gae.
- Learning-rate schedules step once per RL step (VAGEN: per optimizer step); the actor's starts
  after the critic warm-up.
- A shared critic backbone (``ppo.critic_backbone: shared``) is trained by the policy loss only;
  the value loss trains the value head on its features (a detached-head variant). Its values come
  from the policy's scoring pass and the head trains on that pass's features, so a shared critic
  costs no backbone pass of its own.
- Defaults are for the tiny CPU models (larger learning rates, fewer envs); the paper's are in
  docs/algorithms.md reference section 6.

With several processes (``vagent train --nproc N``, or torchrun) the loop reads the same: each
rank rolls out its block of the envs and gets everyone's episodes, so steps 2-4 and 6 see the
global batch; the scoring passes and the update split the rows over the ranks (balanced by
tokens) with FSDP2-sharded models (``vagent.recipes.sharding``, docs/distributed.md).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import torch
from torch import Tensor

from vagent.models.loading import count_parameters
from vagent.models.value import ReferenceModel, ValueModel, build_critic, reference_model
from vagent.recipes.config import PPOConfig, PPOEstimator, RunConfig
from vagent.recipes.optim import make_optimizer, make_scheduler
from vagent.recipes.scoring import rl_temperature, score_batch
from vagent.recipes.session import Session
from vagent.recipes.sharding import policy_to_copy, shard_for_training
from vagent.recipes.stages import PPOAdvantages, PPOScores, StepClock, StepOutcome, TrainState
from vagent.recipes.step import StepLoop, filter_groups, off_policy, reference_kl, step_metrics, token_batch, update_context
from vagent.recipes.update import Learner, actor_update, critic_update
from vagent.rl.advantages import (
    anchor_mask, bi_level_gae, masked_gae, masked_mean, masked_whiten, no_concat_gae, turn_gae,
)
from vagent.rollout.batch import TokenBatch
from vagent.rollout.finish import RolloutResult


def train_ppo(session: Session, start_step: int = 0, resume_from: str | None = None) -> dict[str, float]:
    """Run PPO steps ``start_step + 1 .. steps`` (``start_step`` updates were done before: a
    resume); returns the last validation metrics run by this call."""
    cfg, update_cfg, ppo_cfg = session.cfg, session.cfg.update, session.cfg.ppo
    model = session.loaded.model
    temperature = rl_temperature(cfg)  # log-probs at the rollout's sampling temperature

    # --- set-up: critic, reference model, sharding (several processes), optimizers, schedules
    nets = ppo_models(session)
    if resume_from is not None:
        nets.state.load(resume_from)
    with StepLoop(session, start_step, resume_from) as loop:
        for step in loop.steps():
            clock = StepClock()

            # 1-2. rollout; turn rewards (env + reasoning judges) sit on each turn's last token;
            #      the reward-variance filter (off by default) keeps the groups whose rewards vary most
            episodes = loop.rollout(step)
            batch, filter_scale, filter_metrics = filter_groups(token_batch(session, episodes), ppo_cfg)
            clock.update_starts()

            # 3. scoring passes (no grad): log pi_old, V_old, log pi_ref (a shared-backbone critic
            #    reads V_old off the policy's pass and keeps its features for the critic update)
            scores = score_batch(model, nets.critic, nets.ref, batch, update_cfg, temperature)

            # 4. advantages and returns (KL in the reward first); the critic's targets exist only on critic_mask;
            #    the engine/trainer gap: mismatch metrics, and the rollout correction when configured
            estimate = ppo_advantages(cfg, batch, scores, filter_scale)
            off = off_policy(cfg, batch, scores, session.loaded.encoder.image_token_id)

            # 5. update: critic every step, actor after the critic warm-up (the ratio's anchor, IS
            #    weights and rejections from the engine/trainer gap)
            ctx = update_context(session, step, temperature)
            actor_on = step >= ppo_cfg.critic_warmup_steps
            critic_stats = critic_update(nets.critic_learner, batch, scores, estimate, update_cfg, ctx,
                                         ppo_cfg.value_clip)
            scores = replace(scores, features=None)  # [B, L, H]: free it before the actor's update
            actor_stats = (actor_update(nets.actor_learner, batch, scores, estimate, off, update_cfg, ctx)
                           if actor_on else None)
            lrs = nets.step_schedules(actor_on)
            clock.stop()

            # 6. log, validate, save samples and checkpoint
            stats = critic_stats.metrics | (actor_stats.metrics if actor_stats else {}) | lrs
            metrics = ppo_metrics(cfg, episodes, batch, scores, estimate, filter_metrics | off.metrics | stats,
                                  actor_on, clock)
            loop.finish(StepOutcome(step=step + 1, metrics=metrics, episodes=episodes, batch=batch, scores=scores,
                                    advantages=estimate), nets.state)
    return loop.last_val


@dataclass
class PPOModels:
    """PPO's trained parts besides the policy: the critic, the reference model, parameters,
    optimizers and schedules (``state``: what a checkpoint holds)."""

    critic: ValueModel
    ref: ReferenceModel | None
    actor_params: list[torch.nn.Parameter]
    critic_params: list[torch.nn.Parameter]
    state: TrainState

    @property
    def actor_opt(self) -> torch.optim.Optimizer:
        return self.state.optimizers["actor"]

    @property
    def critic_opt(self) -> torch.optim.Optimizer:
        return self.state.optimizers["critic"]

    @property
    def actor_learner(self) -> Learner:
        """The policy, its trained parameters and the actor's optimizer."""
        return Learner(self.state.modules["policy"], self.actor_params, self.actor_opt)

    @property
    def critic_learner(self) -> Learner:
        """The critic, its trained parameters (a shared critic's: its head) and its optimizer."""
        return Learner(self.critic, self.critic_params, self.critic_opt)

    def step_schedules(self, actor_on: bool) -> dict[str, float]:
        """The learning rates this step used (``optim/*``), then one schedule step: the critic's
        every step, the actor's from its first update (its warm-up starts when the actor does)."""
        lrs = {"optim/actor_lr": self.actor_opt.param_groups[0]["lr"],
               "optim/critic_lr": self.critic_opt.param_groups[0]["lr"]}
        if actor_on:
            self.state.schedulers["actor"].step()
        self.state.schedulers["critic"].step()
        return lrs


def ppo_models(session: Session) -> PPOModels:
    """Build the critic (from the policy's backbone) and the reference model (with a KL term), shard
    them with the policy in a job of several ranks, and make the optimizers and schedules."""
    cfg, update_cfg, ppo_cfg = session.cfg, session.cfg.update, session.cfg.ppo
    model, shared = session.loaded.model, ppo_cfg.critic_backbone == "shared"
    source = policy_to_copy(session)  # one process: `loaded` itself
    critic = build_critic(source, share_backbone=shared, device=session.device)
    ref = reference_model(source) if update_cfg.kl_coef > 0 else None
    del source
    shard_for_training(session, critic, ref)
    actor_params = [q for q in model.parameters() if q.requires_grad]
    critic_params = (list(critic.value_head.parameters()) if shared
                     else [q for q in critic.parameters() if q.requires_grad])
    actor_opt = make_optimizer(actor_params, update_cfg.actor_lr, update_cfg.weight_decay)
    critic_opt = make_optimizer(critic_params, ppo_cfg.critic_lr, update_cfg.weight_decay)
    schedules = {name: make_scheduler(opt, update_cfg.warmup_steps, cfg.steps, update_cfg.lr_schedule)
                 for name, opt in (("actor", actor_opt), ("critic", critic_opt))}
    state = TrainState({"policy": model, "critic": critic}, {"actor": actor_opt, "critic": critic_opt}, schedules)
    session.console.print(f"critic: {count_parameters(critic) / 1e6:.2f}M params ({ppo_cfg.critic_backbone} "
                          f"backbone); reference model: {'yes' if ref else 'no (kl_coef 0)'}")
    return PPOModels(critic, ref, actor_params, critic_params, state)


#: an estimator: (ppo config, batch, token rewards, values, final values) -> (advantages, returns,
#: critic_mask), each [B, L], not whitened (docs/algorithms.md)
Estimator = Callable[[PPOConfig, TokenBatch, Tensor, Tensor, Tensor], tuple[Tensor, Tensor, Tensor]]


def _masked(ppo: PPOConfig, batch: TokenBatch, rewards: Tensor, values: Tensor, final: Tensor):
    M = batch.loss_mask
    adv, ret = masked_gae(rewards, values, M, ppo.gamma_token, ppo.lam, truncated=batch.truncated, final_values=final)
    return adv, ret, M


def _bi_level(ppo: PPOConfig, batch: TokenBatch, rewards: Tensor, values: Tensor, final: Tensor):
    M = batch.loss_mask
    adv, ret = bi_level_gae(rewards, values, M, batch.turn_end_mask, ppo.gamma_token, ppo.gamma_turn, ppo.lam,
                            truncated=batch.truncated, final_values=final)
    return adv, ret, M


def _turn(ppo: PPOConfig, batch: TokenBatch, rewards: Tensor, values: Tensor, final: Tensor):
    adv, ret = turn_gae(rewards, values, batch.loss_mask, batch.turn_end_mask, ppo.gamma_turn, ppo.lam,
                        truncated=batch.truncated, final_values=final)
    return adv, ret, batch.turn_end_mask


def _no_concat(ppo: PPOConfig, batch: TokenBatch, rewards: Tensor, values: Tensor, final: Tensor):
    M = batch.loss_mask
    adv, ret = no_concat_gae(rewards, values, M, batch.traj_ids, batch.row_turn, ppo.gamma_turn, ppo.lam,
                             anchor=ppo.anchor, truncated=batch.truncated, final_values=final)
    return adv, ret, anchor_mask(M, ppo.anchor)


#: ``ppo.estimator`` -> its function (tests/recipes/test_estimator_tables.py: one entry per Literal value)
PPO_ESTIMATORS: dict[PPOEstimator, Estimator] = {
    "masked_gae": _masked, "bi_level_gae": _bi_level, "turn_gae": _turn, "no_concat_gae": _no_concat,
}


def ppo_advantages(cfg: RunConfig, batch: TokenBatch, scores: PPOScores, filter_scale: float) -> PPOAdvantages:
    """Stage 4: the per-token KL to the reference (into the rewards when ``update.kl_in: reward``),
    the configured estimator over token rewards (turn rewards on e_k) and V_old, whitening over M,
    and the reward-variance filter's scale (top_p: sqrt(kept / all groups), as in GRPO)."""
    update_cfg, ppo_cfg, M = cfg.update, cfg.ppo, batch.loss_mask
    rewards, kl_tok = batch.token_rewards, reference_kl(scores, M, update_cfg)
    if kl_tok is not None and update_cfg.kl_in == "reward":
        rewards = rewards - update_cfg.kl_coef * kl_tok
    raw, returns, critic_mask = PPO_ESTIMATORS[ppo_cfg.estimator](ppo_cfg, batch, rewards, scores.values,
                                                                  scores.final_values)
    advantages = masked_whiten(raw, M) * M if ppo_cfg.whiten_advantages else raw
    if filter_scale != 1.0:
        advantages = advantages * filter_scale
    kl_ref = None if kl_tok is None else float(masked_mean(kl_tok, M))
    return PPOAdvantages(advantages=advantages, kl_ref=kl_ref, raw=raw, returns=returns, critic_mask=critic_mask)


def explained_variance(values: Tensor, returns: Tensor, mask: Tensor) -> float:
    """1 - Var(R - V) / Var(R) over ``mask`` (nan when Var(R) is 0)."""
    m = mask.bool()
    R, V = returns[m].float(), values[m].float()
    if R.numel() < 2 or float(R.var(unbiased=False)) == 0.0:
        return float("nan")
    return float(1.0 - (R - V).var(unbiased=False) / R.var(unbiased=False))


def ppo_metrics(cfg: RunConfig, episodes: RolloutResult, batch: TokenBatch, scores: PPOScores, estimate: PPOAdvantages,
                stats: dict[str, float], actor_on: bool, clock: StepClock) -> dict[str, float]:
    """A PPO step's record (docs/metrics.md): rollout, reward, filter, loss/optim stats, then the
    critic's, the batch's and the timings."""
    M, mask, raw, values, returns = batch.loss_mask, estimate.critic_mask, estimate.raw, scores.values, estimate.returns
    # backbones trained: the actor's (after warm-up) and a separate critic's; a shared critic
    # trains only its head, on the scoring pass's features
    backbones = int(actor_on) + int(cfg.ppo.critic_backbone == "separate")
    critic = {
        "actor/updated": float(actor_on),
        "critic/value_mean": float(masked_mean(values, mask)),
        "critic/return_mean": float(masked_mean(returns, mask)),
        "critic/explained_variance": explained_variance(values, returns, mask),  # once, on the whole batch
        "critic/advantage_mean": float(masked_mean(raw, M)),
        "critic/advantage_std": float(masked_mean((raw - masked_mean(raw, M)) ** 2, M).sqrt()),
        "critic/bootstrapped_rows": float(batch.truncated.sum()),
    }
    return step_metrics(cfg, episodes, batch, scores, estimate, stats, clock, critic, backbones)
