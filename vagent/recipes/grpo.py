"""GRPO / RLOO / REINFORCE++ (no critic) for multi-turn VLM agents, as one readable loop.

A group is ``rollout.group_size`` episodes of the same env, seed and config. Each RL step::

    1. rollout     n_train envs x group_size episodes (seeds from (run seed, step)), sampled
    2. rewards     each episode's return R = sum of its turn rewards (env + reasoning judges;
                   ``TokenBatch.episode_returns``); optional reward-variance filter: keep the groups whose
                   returns vary most
    3. scoring     no-grad passes: log pi_old, log pi_ref (if KL)
    4. advantages  grpo: (R - mean_g) / (std_g + eps) | rloo: leave-one-out | reinforce_pp,
                   computed per TRAJECTORY and broadcast to all its sampled tokens (and rows);
                   gigpo: grpo's plus omega x a step-level one, per TURN, over the turns of the
                   group that saw the same env state (key: sha256 of env.state() before the turn);
                   the engine/trainer gap (mismatch/*) and the rollout correction (stages.off_policy)
    5. update      PPO-clip with clip-higher / dual-clip, entropy bonus, KL to the reference in
                   the loss (k3), epochs x mini-batches x micro-batches
    6. log         rollout/ reward/ filter/ loss/ actor/ optim/ perf/; validation every val.every
                   steps (and at step 0); samples, checkpoint, plots (``StepLoop.finish``)

The loop counts ``updates_done`` (0..steps-1, what seeds the step); the update it makes is RL step
``updates_done + 1`` (1..steps, what its metrics, rollouts and checkpoint carry), as in ``ppo.py``.

How it departs from GRPO (DeepSeekMath) / ViGoRL:

- Advantages are per trajectory even in per-turn modes (no_concat / window): a trajectory with
  more turns has more rows but the same advantage, and group statistics count it once.
- ``log pi_old`` is recomputed with the training forward pass (see ``ppo.py``); the gap to the
  engine's sampling log-probs is logged (``mismatch/*``) and, with ``rollout_correction``,
  corrected (truncated IS, rejection; decoupled PPO with ``rollout.overlap: 1``).
- KL is in the loss only (``update.kl_in`` must be ``loss``); ViGoRL's defaults are clip 0.2/0.28,
  dual-clip 3, k3 KL 0.01 (configs/frozenlake_grpo.yaml uses them).
- Groups whose rewards are all equal get advantage 0 and still count in the token mean (as
  verl); use ``grpo.filter`` to drop them.
- Several processes (torchrun): a group is rolled out whole on one rank (a rank plays a block of
  env specs, one group each) and the episodes are gathered, so group statistics, the filter and
  the token mean are the single-process ones (``vagent.rollout.loop.rollout_on_ranks``).
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from vagent.runconfig import GRPOConfig, GRPOEstimator, RunConfig
from vagent.recipes.scoring import rl_temperature, score_batch
from vagent.recipes.session import Session
from vagent.recipes.stages import (
    Advantages, Scores, StepClock, StepOutcome, filter_groups, off_policy, reference_kl, token_batch,
    trajectory_rows,
)
from vagent.recipes.step import StepLoop, rl_models
from vagent.recipes.update import actor_update
from vagent.rl.advantages import masked_mean
from vagent.rl.group_advantages import gigpo_advantages, grpo_advantages, reinforce_pp_advantages, rloo_advantages
from vagent.rollout.batch import TokenBatch


def train_grpo(session: Session, start_step: int = 0, resume_from: str | None = None,
               last_checkpoint: str | None = None) -> dict[str, float]:
    """Run GRPO steps ``start_step + 1 .. steps`` (``start_step`` updates were done before: a
    resume from ``resume_from``); ``last_checkpoint`` as in ``train_ppo``. Returns the last
    validation metrics run by this call."""
    cfg, update_cfg = session.cfg, session.cfg.update
    model = session.loaded.model
    temperature = rl_temperature(cfg)  # log-probs at the rollout's sampling temperature

    # --- set-up: reference model (only with a KL term), sharding (several processes), optimizer, schedule
    nets = rl_models(session)
    if resume_from is not None:
        nets.state.load(resume_from)
    with StepLoop(session, start_step, resume_from, last_checkpoint) as loop:
        for updates_done in loop.steps():  # this step is RL step updates_done + 1
            clock = StepClock()

            # 1-2. rollout (each episode's return is the sum of its turn rewards); the reward-variance
            #      filter keeps the groups whose returns vary most
            episodes = loop.rollout(updates_done)
            kept = filter_groups(token_batch(episodes, loop.layout), cfg.grpo)
            batch = kept.batch
            clock.update_starts()

            # 3. scoring passes (no grad): log pi_old, log pi_ref
            scores = score_batch(model, None, nets.ref, batch, update_cfg, temperature)

            # 4. group-relative advantages per trajectory, broadcast over its sampled tokens;
            #    the engine/trainer gap: mismatch metrics, and the rollout correction when configured
            estimate = group_advantages(cfg, batch, scores, kept.scale)
            off = off_policy(cfg, batch, scores, loop.image_token_id)

            # 5. update
            ctx = loop.update_context(updates_done, temperature)
            actor_stats = actor_update(nets.learners["actor"], batch, scores, estimate, off, update_cfg, ctx)
            lrs = nets.step_schedules()
            clock.stop()

            # 6. log, validate, save samples and checkpoint
            own = {"actor/advantage_abs_mean": float(masked_mean(estimate.advantages.abs(), batch.loss_mask))}
            loop.finish(StepOutcome(ctx.rl_step, episodes, batch, scores, estimate, clock,
                                    stage_metrics=(kept.metrics, off.metrics, actor_stats.metrics, lrs),
                                    own=own, backbones=1), nets.state)
    return loop.last_val


def group_advantages(cfg: RunConfig, batch: TokenBatch, scores: Scores, filter_scale: float) -> Advantages:
    """Stage 4: the configured estimator's advantages (:func:`trajectory_advantages`) times the
    reward-variance filter's scale, and the mean per-token KL of pi_old to the reference over M
    (logged; GRPO's KL term is in the loss)."""
    kl_tok = reference_kl(scores, batch.loss_mask, cfg.update)
    kl_ref = None if kl_tok is None else float(masked_mean(kl_tok, batch.loss_mask))
    return Advantages(advantages=trajectory_advantages(cfg, batch) * filter_scale, kl_ref=kl_ref)


def trajectory_advantages(cfg: RunConfig, batch: TokenBatch) -> Tensor:
    """Advantages [B, L] of the configured ``grpo.estimator``, from the trajectory returns
    (``batch.episode_returns``): one value per trajectory (or per trajectory and turn, gigpo) on its rows'
    M=1 tokens."""
    row_traj, first = trajectory_rows(batch)  # [B] -> trajectory slot, [T] -> its first row
    returns, groups = batch.episode_returns[first], batch.group_ids[first]  # [T]
    return GRPO_ESTIMATORS[cfg.grpo.estimator](cfg.grpo, batch, row_traj, returns, groups)


def _per_trajectory(estimator: Callable[..., tuple[Tensor, Tensor]], *options: str):
    """An estimator over trajectory returns [T] (one "token" per trajectory) as a table entry: its
    A of each row's trajectory, on the row's M=1 tokens; ``options`` name the grpo config fields it takes."""
    def advantages(grpo: GRPOConfig, batch: TokenBatch, row_traj: Tensor, returns: Tensor, groups: Tensor) -> Tensor:
        ones = torch.ones(returns.numel(), 1, dtype=torch.bool, device=returns.device)
        kwargs = {name: getattr(grpo, name) for name in options}
        a, _ = estimator(returns, groups, ones, **kwargs)
        return a[:, 0][row_traj][:, None] * batch.loss_mask
    return advantages


def gigpo_token_advantages(grpo: GRPOConfig, batch: TokenBatch, row_traj: Tensor, returns: Tensor,
                           groups: Tensor) -> Tensor:
    """GiGPO advantages [B, L] (``vagent.rl.gigpo_advantages``) on each row's M=1 tokens.

    Laid out per trajectory and turn: ``step_rewards`` [T, K] (turn k's reward, from its turn-end
    token), the state key before each turn (``batch.state_keys``: every turn of a concat row, the
    row's own turn in per-turn modes) and one "token" per turn; the result A[traj, k] goes on the
    sampled tokens of turn k (``batch.turn_index``). row_traj [B]: trajectory slot of each row;
    returns, groups [T]: per trajectory.
    """
    M = batch.loss_mask
    n_traj, K = returns.numel(), int(batch.turn_index.max()) + 1
    ends = (batch.turn_end_mask & M).nonzero(as_tuple=True)  # (row, position) of each turn's last token
    step_rewards = torch.zeros(n_traj, K, device=M.device).index_put_(
        (row_traj[ends[0]], batch.turn_index[ends]), batch.token_rewards[ends].float(), accumulate=True)
    keys: list[dict[int, str]] = [{} for _ in range(n_traj)]
    for b, row_keys in enumerate(batch.state_keys):
        turn = int(batch.row_turn[b])
        keys[int(row_traj[b])].update({turn: row_keys[0]} if turn >= 0 else dict(enumerate(row_keys)))
    steps = [[k[t] for t in range(len(k))] for k in keys]  # each trajectory's turns 0..T_b-1, in order
    n_steps = torch.tensor([len(k) for k in steps], device=M.device)
    step_mask = torch.arange(K, device=M.device)[None, :] < n_steps[:, None]  # [T, K]
    turn_ids = torch.arange(K, device=M.device).expand(n_traj, K)
    a, _ = gigpo_advantages(returns, groups, step_rewards, steps, step_mask, turn_ids, gamma=grpo.gigpo_gamma,
                            omega=grpo.gigpo_omega, norm_by_std=grpo.norm_by_std)
    return a[row_traj[:, None], batch.turn_index.clamp(min=0)] * M  # A of each token's (trajectory, turn)


#: ``grpo.estimator`` -> (grpo config, batch, row -> trajectory slot [B], returns [T], groups [T]) -> A [B, L]
#: (tests/recipes/test_estimator_tables.py: one entry per Literal value)
GRPO_ESTIMATORS: dict[GRPOEstimator, Callable[[GRPOConfig, TokenBatch, Tensor, Tensor, Tensor], Tensor]] = {
    "grpo": _per_trajectory(grpo_advantages, "norm_by_std"),
    "rloo": _per_trajectory(rloo_advantages),
    "reinforce_pp": _per_trajectory(reinforce_pp_advantages),
    "gigpo": gigpo_token_advantages,
}
