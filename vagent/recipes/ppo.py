"""PPO with a critic for multi-turn VLM agents (VAGEN, arXiv 2510.16907), as one readable loop.

Each RL step, in the order it runs::

    1. rollout     n_train envs x group_size episodes (seeds from (run seed, step)), sampled
    2. rewards     each turn's reward (env + reasoning judges) on its last sampled token e_k;
                   optional reward-variance filter over groups (ppo.filter, as grpo.filter)
    3. scoring     no-grad passes: log pi_old, V_old (critic), log pi_ref (if KL); KL in reward
    4. advantages  masked_gae | bi_level_gae | turn_gae | no_concat_gae, then whitened over M;
                   the engine/trainer gap (mismatch/*) and the rollout correction (stages.off_policy)
    5. update      critic: clipped value loss where returns are defined; actor: PPO-clip +
                   entropy bonus (+ KL in loss); epochs x mini-batches x micro-batches
    6. log         rollout/ reward/ loss/ actor/ critic/ optim/ perf/; validation (greedy, val
                   split) every val.every steps; samples, checkpoint, plots
    (validation also before the first step: step 0 is the policy after SFT)

The loop counts ``updates_done`` (0..steps-1): the seeds of the step's rollout and mini-batch order
are functions of (run seed, updates_done). The update it makes is RL step ``updates_done + 1``
(1..steps), and its metrics, rollouts and checkpoint carry that number (docs/metrics.md, "Steps").

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

from dataclasses import replace
from typing import TYPE_CHECKING, Callable

from torch import Tensor

from vagent.models.loading import count_parameters
from vagent.models.value import ValueModel
from vagent.runconfig import PPOConfig, PPOEstimator, RunConfig
from vagent.recipes.scoring import rl_temperature, score_batch
from vagent.recipes.session import Session
from vagent.recipes.stages import (
    PPOAdvantages, PPOScores, StepClock, StepOutcome, filter_groups, off_policy, reference_kl, token_batch,
)
from vagent.recipes.step import RLModels, StepLoop, rl_models
from vagent.recipes.update import actor_update, critic_update
from vagent.rl.advantages import (
    anchor_mask, bi_level_gae, masked_gae, masked_mean, masked_whiten, no_concat_gae, turn_gae,
)
from vagent.rl.losses import explained_variance
from vagent.rollout.batch import TokenBatch

if TYPE_CHECKING:
    from vagent.runs import Console


def train_ppo(session: Session, start_step: int = 0, resume_from: str | None = None,
              last_checkpoint: str | None = None) -> dict[str, float]:
    """Run PPO steps ``start_step + 1 .. steps`` (``start_step`` updates were done before: a
    resume from ``resume_from``); ``last_checkpoint``: the run's newest checkpoint before RL (a
    resume's, or SFT's), named by errors until RL writes one. Returns the last validation metrics
    run by this call."""
    cfg, update_cfg, ppo_cfg = session.cfg, session.cfg.update, session.cfg.ppo
    model = session.loaded.model
    temperature = rl_temperature(cfg)  # log-probs at the rollout's sampling temperature

    # --- set-up: critic, reference model, sharding (several processes), optimizers, schedules
    nets, critic = ppo_models(session)
    if resume_from is not None:
        nets.state.load(resume_from)
    with StepLoop(session, start_step, resume_from, last_checkpoint) as loop:
        for updates_done in loop.steps():  # this step is RL step updates_done + 1
            clock = StepClock()

            # 1-2. rollout; turn rewards (env + reasoning judges) sit on each turn's last token;
            #      the reward-variance filter (off by default) keeps the groups whose rewards vary most
            episodes = loop.rollout(updates_done)
            kept = filter_groups(token_batch(episodes, loop.layout), ppo_cfg)
            batch = kept.batch
            clock.update_starts()

            # 3. scoring passes (no grad): log pi_old, V_old, log pi_ref (a shared-backbone critic
            #    reads V_old off the policy's pass and keeps its features for the critic update)
            scores = score_batch(model, critic, nets.ref, batch, update_cfg, temperature)

            # 4. advantages and returns (KL in the reward first); the critic's targets exist only on critic_mask;
            #    the engine/trainer gap: mismatch metrics, and the rollout correction when configured
            estimate = ppo_advantages(cfg, batch, scores, kept.scale)
            off = off_policy(cfg, batch, scores, loop.image_token_id)

            # 5. update: critic every step, actor after the critic warm-up (the ratio's anchor, IS
            #    weights and rejections from the engine/trainer gap)
            ctx = loop.update_context(updates_done, temperature)
            actor_on = updates_done >= ppo_cfg.critic_warmup_steps
            critic_stats = critic_update(nets.learners["critic"], batch, scores, estimate, update_cfg, ctx,
                                         ppo_cfg.value_clip)
            scores = replace(scores, features=None)  # [B, L, H]: free it before the actor's update
            actor_stats = (actor_update(nets.learners["actor"], batch, scores, estimate, off, update_cfg, ctx).metrics
                           if actor_on else {})
            lrs = nets.step_schedules(held=() if actor_on else ("actor",))
            clock.stop()

            # 6. log, validate, save samples and checkpoint
            announce_warmup_end(session.console, ppo_cfg, ctx.rl_step, actor_on)
            loop.finish(StepOutcome(
                ctx.rl_step, episodes, batch, scores, estimate, clock,
                stage_metrics=(kept.metrics, off.metrics, critic_stats.metrics, actor_stats, lrs),
                own=critic_metrics(batch, scores, estimate, actor_on),
                # backbones trained: the actor's (after warm-up) and a separate critic's (a shared one trains its head)
                backbones=int(actor_on) + int(ppo_cfg.critic_backbone == "separate"),
                values=scores.values, returns=estimate.returns, shown=warmup_field(ppo_cfg, ctx.rl_step, actor_on),
            ), nets.state)
    return loop.last_val


def ppo_models(session: Session) -> tuple[RLModels, ValueModel]:
    """PPO's set-up (``vagent.recipes.step.rl_models`` with a critic on ``ppo.critic_backbone``):
    the models, optimizers and schedules, and the critic."""
    nets = rl_models(session, session.cfg.ppo.critic_backbone)
    if nets.critic is None:
        raise RuntimeError("rl_models built no critic for PPO: it builds one whenever critic_backbone is given")
    session.console.print(f"critic: {count_parameters(nets.critic) / 1e6:.2f}M params "
                          f"({session.cfg.ppo.critic_backbone} backbone); reference model: "
                          f"{'yes' if nets.ref else 'no (kl_coef 0)'}")
    return nets, nets.critic


def warmup_field(ppo_cfg: PPOConfig, rl_step: int, actor_on: bool) -> dict[str, str]:
    """The progress bar's ``actor`` field: ``updated``, or ``critic-warm-up(k/N)`` while the critic
    warms up (``ppo.critic_warmup_steps``)."""
    return {"actor": "updated" if actor_on else f"critic-warm-up({rl_step}/{ppo_cfg.critic_warmup_steps})"}


def announce_warmup_end(console: Console, ppo_cfg: PPOConfig, rl_step: int, actor_on: bool) -> None:
    """Say on the console that the critic's warm-up is over, at the actor's first update after one."""
    warmup = ppo_cfg.critic_warmup_steps
    if warmup and actor_on and rl_step == warmup + 1:
        console.print(f"RL step {rl_step}: the critic's warm-up is over ({warmup} step(s)); the actor "
                      "updates from this step on")


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


def critic_metrics(batch: TokenBatch, scores: PPOScores, estimate: PPOAdvantages, actor_on: bool) -> dict[str, float]:
    """PPO's own metrics of a step (docs/metrics.md): whether the actor updated, and the critic's
    values, returns, explained variance (once, on the whole batch) and raw advantages."""
    M, mask, raw, values, returns = batch.loss_mask, estimate.critic_mask, estimate.raw, scores.values, estimate.returns
    return {
        "actor/updated": float(actor_on),
        "critic/value_mean": float(masked_mean(values, mask)),
        "critic/return_mean": float(masked_mean(returns, mask)),
        "critic/explained_variance": explained_variance(values, returns, mask),
        "critic/advantage_mean": float(masked_mean(raw, M)),
        "critic/advantage_std": float(masked_mean((raw - masked_mean(raw, M)) ** 2, M).sqrt()),
        "critic/bootstrapped_rows": float(batch.truncated.sum()),
    }
