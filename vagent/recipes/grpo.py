"""GRPO / RLOO / REINFORCE++ (no critic) for multi-turn VLM agents, as one readable loop.

A group is ``rollout.group_size`` episodes of the same env, seed and config. Each RL step::

    1. rollout     n_train envs x group_size episodes (seeds from (run seed, step)), sampled
    2. rewards     each episode's score R = sum of its turn rewards (env + reasoning judges)
    3. filter      optional reward-variance filter: keep the groups whose rewards vary most
    4. advantages  grpo: (R - mean_g) / (std_g + eps) | rloo: leave-one-out | reinforce_pp,
                   computed per TRAJECTORY and broadcast to all its sampled tokens (and rows);
                   gigpo: grpo's plus omega x a step-level one, per TURN, over the turns of the
                   group that saw the same env state (key: sha256 of env.state() before the turn)
    5. update      PPO-clip with clip-higher / dual-clip, entropy bonus, KL to the reference in
                   the loss (k3), epochs x mini-batches x micro-batches
    6. log         rollout/ reward/ filter/ loss/ actor/ optim/ perf/; validation every val.every
                   steps (and at step 0); samples, checkpoint, plots (``ppo.after_step``)

Steps count updates done: the k-th update is RL step k (1..steps), as in ``ppo.py``.

How it departs from GRPO (DeepSeekMath) / ViGoRL:

- Advantages are per trajectory even in per-turn modes (no_concat / window): a trajectory with
  more turns has more rows but the same advantage, and group statistics count it once.
- ``log pi_old`` is recomputed with the training forward pass (see ``ppo.py``).
- KL is in the loss only (``update.kl_in`` must be ``loss``); ViGoRL's defaults are clip 0.2/0.28,
  dual-clip 3, k3 KL 0.01 (configs/frozenlake_grpo.yaml uses them).
- Groups whose rewards are all equal get advantage 0 and still count in the token mean (as
  verl); use ``grpo.filter`` to drop them.
- Several processes (torchrun): a group is rolled out whole on one rank (a rank plays a block of
  env specs, one group each) and the episodes are gathered, so group statistics, the filter and
  the token mean are the single-process ones (``vagent.recipes.rollouts``).
"""

from __future__ import annotations

import time

import torch
from torch import Tensor

from vagent.recipes.batching import filter_groups
from vagent.recipes.optim import make_optimizer, make_scheduler
from vagent.recipes.ppo import after_step, batch_mode, log_validation
from vagent.recipes.rollouts import reward_metrics, train_rollout
from vagent.recipes.scoring import rl_temperature, score_logprobs
from vagent.recipes.session import Session
from vagent.recipes.sharding import policy_to_copy, shard_for_training
from vagent.recipes.update import UpdateContext, actor_update


def trajectory_advantages(cfg, batch) -> Tensor:
    """Advantages [B, L] from the trajectory scores, one value per trajectory on its M=1 tokens."""
    from vagent.rl.advantages import grpo_advantages, reinforce_pp_advantages, rloo_advantages

    trajs, row_traj = torch.unique(batch.traj_ids, return_inverse=True)  # [T], [B] -> trajectory slot
    first = torch.full((trajs.numel(),), batch.batch_size, dtype=torch.long, device=row_traj.device)
    first = first.scatter_reduce(0, row_traj, torch.arange(batch.batch_size, device=row_traj.device), "amin")
    scores, groups = batch.scores[first], batch.group_ids[first]  # [T]
    ones = torch.ones(trajs.numel(), 1, dtype=torch.bool, device=scores.device)  # one "token" per trajectory
    g = cfg.grpo
    if g.estimator == "gigpo":
        return gigpo_token_advantages(cfg, batch, row_traj, scores, groups)
    if g.estimator == "grpo":
        a, _ = grpo_advantages(scores, groups, ones, norm_by_std=g.norm_by_std)
    elif g.estimator == "rloo":
        a, _ = rloo_advantages(scores, groups, ones)
    else:
        a, _ = reinforce_pp_advantages(scores, groups, ones)
    return a[:, 0][row_traj][:, None] * batch.loss_mask  # A of each row's trajectory, on M


def gigpo_token_advantages(cfg, batch, row_traj: Tensor, scores: Tensor, groups: Tensor) -> Tensor:
    """GiGPO advantages [B, L] (``vagent.rl.gigpo_advantages``) on each row's M=1 tokens.

    Laid out per trajectory and turn: ``step_rewards`` [T, K] (turn k's reward, from its turn-end
    token), the state key before each turn (``batch.state_keys``: every turn of a concat row, the
    row's own turn in per-turn modes) and one "token" per turn; the result A[traj, k] goes on the
    sampled tokens of turn k (``batch.turn_index``). row_traj [B]: trajectory slot of each row;
    scores, groups [T]: per trajectory.
    """
    from vagent.rl.advantages import gigpo_advantages

    M = batch.loss_mask
    n_traj, K = scores.numel(), int(batch.turn_index.max()) + 1
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
    g = cfg.grpo
    a, _ = gigpo_advantages(scores, groups, step_rewards, steps, step_mask, turn_ids, gamma=g.gigpo_gamma,
                            omega=g.gigpo_omega, norm_by_std=g.norm_by_std)
    return a[row_traj[:, None], batch.turn_index.clamp(min=0)] * M  # A of each token's (trajectory, turn)


def train_grpo(session: Session, start_step: int = 0, resume_from: str | None = None) -> dict[str, float]:
    """Run GRPO steps ``start_step + 1 .. steps`` (``start_step`` updates were done before: a
    resume); returns the last validation metrics run by this call."""
    from vagent.models.value import reference_model
    from vagent.rl.advantages import masked_mean
    from vagent.rl.losses import kl_penalty
    from vagent.rollout.batch import build_token_batch
    from vagent.rollout.driver import make_driver
    from vagent.rollout.hf_policy import HFPolicy
    from vagent.runs import StepProgress, load_checkpoint

    cfg, u = session.cfg, session.cfg.update
    loaded, device = session.loaded, session.device
    model = loaded.model
    T, chunk = u.micro_batch_tokens, u.logprob_chunk
    tau = rl_temperature(cfg)  # log-probs at the rollout's sampling temperature

    # --- set-up: reference model (only with a KL term), sharding (several processes), optimizer, schedule
    ref = reference_model(policy_to_copy(session)) if u.kl_coef > 0 else None
    shard_for_training(session, ref=ref)
    params = [q for q in model.parameters() if q.requires_grad]
    opt = make_optimizer(params, u.actor_lr, u.weight_decay)
    sched = make_scheduler(opt, u.warmup_steps, cfg.steps, u.lr_schedule)
    modules, optimizers, schedulers = {"policy": model}, {"actor": opt}, {"actor": sched}
    if resume_from is not None:
        load_checkpoint(resume_from, modules, optimizers, schedulers)
    policy = HFPolicy(loaded, prefix_cache=cfg.rollout.prefix_cache, max_context_tokens=cfg.model.max_context_tokens)
    reasoning = session.reasoning_reward()
    # where training rollouts are generated (rollout.engine / replicas / schedule / overlap); the
    # default is train_rollout(session, policy, step, reasoning) with this in-process policy
    driver = make_driver(cfg, loaded, policy,
                         lambda pol, k, unshard: train_rollout(session, pol, k, reasoning, unshard=unshard),
                         model_dir=session.model_dir, fresh_model=session.load_fresh_model)
    bar = StepProgress(cfg.steps, cfg.recipe.upper(), session.console, cfg.log.progress, start=start_step)
    last_val: dict[str, float] = {}
    try:
        if cfg.val.every and start_step == 0:  # step 0: the policy before RL (after SFT)
            last_val = log_validation(session, policy, 0)
        for step in range(start_step, cfg.steps):  # `step` updates done; this one makes RL step step + 1
            t_step = time.perf_counter()

            # 1-2. rollout; each episode's score is the sum of its turn rewards
            episodes = driver.get(step)
            full = build_token_batch(episodes, mode=batch_mode(cfg), pad_token_id=loaded.encoder.pad_token_id).to(device)

            # 3. reward-variance filter (groups whose rewards vary most)
            batch, scale, filter_metrics = filter_groups(cfg, full)
            M = batch.loss_mask
            t_update = time.perf_counter()

            # 4. group-relative advantages per trajectory, broadcast over its sampled tokens
            advantages = trajectory_advantages(cfg, batch) * scale

            # scoring passes (no grad): log pi_old, log pi_ref
            old_logprobs, ref_logprobs = score_logprobs(model, ref, batch, T, chunk, tau)

            # 5. update
            ctx = UpdateContext(device, session.bf16, cfg.seed, step, session.last_checkpoint, tau)
            # overlap 1: the batch was sampled one update ago; the ratio is against its behaviour log-probs
            behaviour = batch.old_logprobs * M if cfg.rollout.overlap else old_logprobs
            stats = actor_update(model, params, opt, batch, advantages, behaviour, ref_logprobs, u, ctx)
            lr = opt.param_groups[0]["lr"]
            sched.step()
            t_end = time.perf_counter()

            # 6. log
            metrics = dict(episodes.metrics)
            metrics.update(reward_metrics(episodes))
            metrics.update(filter_metrics)
            metrics.update(stats)
            metrics.update({
                "optim/actor_lr": lr,
                "actor/logprob_diff": float(masked_mean((old_logprobs - batch.old_logprobs).abs(), M)),
                "actor/advantage_abs_mean": float(masked_mean(advantages.abs(), M)),
                "rollout/batch_rows": float(batch.batch_size),
                "rollout/batch_tokens": float(batch.num_tokens),
                "rollout/sampled_tokens": float(M.sum()),
                "perf/step_time_s": t_end - t_step,
                "perf/update_time_s": t_end - t_update,
                "perf/update_tokens_per_s": batch.num_tokens * u.epochs / max(1e-9, t_end - t_update),
            })
            if ref_logprobs is not None:
                metrics["actor/kl_ref"] = float(masked_mean(kl_penalty(old_logprobs, ref_logprobs, u.kl_kind), M))
            dump = dict(batch=batch, logprobs=old_logprobs, advantages=advantages)
            last_val = after_step(session, step + 1, metrics, episodes, dump, policy, modules, optimizers,
                                  schedulers, bar) or last_val
    finally:
        bar.close()
        driver.close()
    return last_val
