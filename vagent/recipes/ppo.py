"""PPO with a critic for multi-turn VLM agents (VAGEN, arXiv 2510.16907), as one readable loop.

Each RL step, in the order it runs::

    1. rollout     n_train envs x group_size episodes (seeds from (run seed, step)), sampled
    2. rewards     each turn's reward (env + reasoning judges) on its last sampled token e_k;
                   optional reward-variance filter over groups (ppo.filter, as grpo.filter)
    3. scoring     no-grad passes: log pi_old, V_old (critic), log pi_ref (if KL); KL in reward
    4. advantages  masked_gae | bi_level_gae | turn_gae | no_concat_gae, then whitened over M
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
  padding numerics; the mean absolute difference is logged as ``actor/logprob_diff``).
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

import time
from typing import Any

import torch
from torch import Tensor

from vagent.distributed import generation_mode
from vagent.recipes.batching import per_row
from vagent.recipes.optim import make_optimizer, make_scheduler
from vagent.recipes.rollouts import reward_metrics, train_rollout
from vagent.recipes.scoring import (
    critic_forward, rl_temperature, score_logprobs, score_reference, score_shared, shift_right,
)
from vagent.recipes.session import Session
from vagent.recipes.sharding import policy_export, policy_to_copy, shard_for_training
from vagent.recipes.update import UpdateContext, actor_update, critic_update


def batch_mode(cfg) -> str:
    """The ``build_token_batch`` mode of the rollout settings."""
    if cfg.rollout.mode == "no_concat":
        return "no_concat"
    return "window" if cfg.rollout.window is not None else "concat"


def estimate_advantages(cfg, batch, rewards: Tensor, values: Tensor, final_values: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(advantages, returns, critic_mask) [B, L] for the configured estimator (not whitened).

    rewards [B, L]: token rewards (turn rewards on e_k, minus the per-token KL when kl_in=reward);
    values [B, L]: V before each token; final_values [B]: V(final observation) of truncated rows.
    """
    from vagent.rl.advantages import anchor_mask, bi_level_gae, masked_gae, no_concat_gae, turn_gae

    p, M = cfg.ppo, batch.loss_mask
    boot = dict(truncated=batch.truncated, final_values=final_values)
    if p.estimator == "masked_gae":
        adv, ret = masked_gae(rewards, values, M, p.gamma_token, p.lam, **boot)
        return adv, ret, M
    if p.estimator == "bi_level_gae":
        adv, ret = bi_level_gae(rewards, values, M, batch.turn_end_mask, p.gamma_token, p.gamma_turn, p.lam, **boot)
        return adv, ret, M
    if p.estimator == "turn_gae":
        adv, ret = turn_gae(rewards, values, M, batch.turn_end_mask, p.gamma_turn, p.lam, **boot)
        return adv, ret, batch.turn_end_mask
    adv, ret = no_concat_gae(rewards, values, M, batch.traj_ids, batch.row_turn, p.gamma_turn, p.lam,
                             anchor=p.anchor, **boot)
    return adv, ret, anchor_mask(M, p.anchor)


def explained_variance(values: Tensor, returns: Tensor, mask: Tensor) -> float:
    """1 - Var(R - V) / Var(R) over ``mask`` (nan when Var(R) is 0)."""
    m = mask.bool()
    R, V = returns[m].float(), values[m].float()
    if R.numel() < 2 or float(R.var(unbiased=False)) == 0.0:
        return float("nan")
    return float(1.0 - (R - V).var(unbiased=False) / R.var(unbiased=False))


def train_ppo(session: Session, start_step: int = 0, resume_from: str | None = None) -> dict[str, float]:
    """Run PPO steps ``start_step + 1 .. steps`` (``start_step`` updates were done before: a
    resume); returns the last validation metrics run by this call."""
    from vagent.models.loading import count_parameters
    from vagent.models.value import build_critic, reference_model
    from vagent.rl.advantages import masked_mean, masked_whiten
    from vagent.rl.losses import kl_penalty
    from vagent.rollout.batch import build_token_batch
    from vagent.rollout.driver import make_driver
    from vagent.rollout.hf_policy import HFPolicy
    from vagent.runs import StepProgress, load_checkpoint

    cfg, u, p = session.cfg, session.cfg.update, session.cfg.ppo
    loaded, device = session.loaded, session.device
    model = loaded.model
    T, chunk = u.micro_batch_tokens, u.logprob_chunk
    tau = rl_temperature(cfg)  # log-probs at the rollout's sampling temperature

    # --- set-up: critic (from the policy's backbone), reference model, sharding (several
    #     processes), optimizers, schedules
    source = policy_to_copy(session)  # one process: `loaded` itself
    critic = build_critic(source, share_backbone=p.critic_backbone == "shared", device=device)
    ref = reference_model(source) if u.kl_coef > 0 else None
    del source
    shard_for_training(session, critic, ref)
    actor_params = [q for q in model.parameters() if q.requires_grad]
    critic_params = (list(critic.value_head.parameters()) if p.critic_backbone == "shared"
                     else [q for q in critic.parameters() if q.requires_grad])
    actor_opt = make_optimizer(actor_params, u.actor_lr, u.weight_decay)
    critic_opt = make_optimizer(critic_params, p.critic_lr, u.weight_decay)
    actor_sched = make_scheduler(actor_opt, u.warmup_steps, cfg.steps, u.lr_schedule)
    critic_sched = make_scheduler(critic_opt, u.warmup_steps, cfg.steps, u.lr_schedule)
    modules = {"policy": model, "critic": critic}
    optimizers, schedulers = {"actor": actor_opt, "critic": critic_opt}, {"actor": actor_sched, "critic": critic_sched}
    if resume_from is not None:
        load_checkpoint(resume_from, modules, optimizers, schedulers)
    session.console.print(f"critic: {count_parameters(critic) / 1e6:.2f}M params ({p.critic_backbone} backbone); "
                          f"reference model: {'yes' if ref else 'no (kl_coef 0)'}")
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

            # 1-2. rollout; turn rewards (env + reasoning judges) sit on each turn's last token
            episodes = driver.get(step)
            batch = build_token_batch(episodes, mode=batch_mode(cfg), pad_token_id=loaded.encoder.pad_token_id).to(device)
            filter_metrics, filter_scale = {}, 1.0
            if p.filter != "none":  # reward-variance filter (off by default): the groups whose rewards vary most
                from vagent.recipes.batching import filter_groups

                batch, filter_scale, filter_metrics = filter_groups(cfg, batch, p)
            M = batch.loss_mask
            t_update = time.perf_counter()

            # 3. scoring passes (no grad): log pi_old, V_old, log pi_ref (a shared-backbone critic
            #    reads V_old off the policy's pass and keeps its features for the critic update)
            critic.eval()
            features = None
            if critic.shares_backbone:
                old_logprobs, raw_values, features = score_shared(model, critic, batch, T, chunk, tau)
                ref_logprobs = score_reference(ref, batch, T, chunk, tau)
            else:
                old_logprobs, ref_logprobs = score_logprobs(model, ref, batch, T, chunk, tau)
                raw_values = per_row(batch, T, lambda mb: critic_forward(critic, mb))
            values = shift_right(raw_values) * M  # V before each sampled token
            final_values = raw_values.gather(1, batch.bootstrap_index.clamp(min=0)[:, None])[:, 0]
            final_values = torch.where(batch.truncated, final_values, torch.zeros_like(final_values))
            rewards = batch.token_rewards
            kl_ref = None
            if ref_logprobs is not None:
                kl_tok = kl_penalty(old_logprobs, ref_logprobs, u.kl_kind) * M
                kl_ref = float(masked_mean(kl_tok, M))
                if u.kl_in == "reward":
                    rewards = rewards - u.kl_coef * kl_tok

            # 4. advantages and returns; the critic's targets exist only on critic_mask
            advantages, returns, critic_mask = estimate_advantages(cfg, batch, rewards, values, final_values)
            raw_adv = advantages
            if p.whiten_advantages:
                advantages = masked_whiten(advantages, M) * M
            if filter_scale != 1.0:  # top_p: sqrt(kept / all groups), as in GRPO
                advantages = advantages * filter_scale

            # 5. update: critic every step, actor after the critic warm-up
            ctx = UpdateContext(device, session.bf16, cfg.seed, step, session.last_checkpoint, tau)
            stats = critic_update(critic, critic_params, critic_opt, batch, values, returns, critic_mask, u,
                                  p.value_clip, ctx, features)
            del features
            if step >= p.critic_warmup_steps:
                # overlap 1: the batch was sampled one update ago; the ratio is against its behaviour log-probs
                behaviour = batch.old_logprobs * M if cfg.rollout.overlap else old_logprobs
                stats.update(actor_update(model, actor_params, actor_opt, batch, advantages, behaviour,
                                          ref_logprobs, u, ctx))
            lrs = {"optim/actor_lr": actor_opt.param_groups[0]["lr"], "optim/critic_lr": critic_opt.param_groups[0]["lr"]}
            if step >= p.critic_warmup_steps:  # the actor's warm-up starts when the actor does
                actor_sched.step()
            critic_sched.step()
            t_end = time.perf_counter()

            # 6. log
            metrics = dict(episodes.metrics)
            metrics.update(reward_metrics(episodes))
            metrics.update(filter_metrics)
            metrics.update(stats)
            metrics.update(lrs)
            metrics.update({
                "actor/logprob_diff": float(masked_mean((old_logprobs - batch.old_logprobs).abs(), M)),
                "actor/updated": float(step >= p.critic_warmup_steps),
                "critic/value_mean": float(masked_mean(values, critic_mask)),
                "critic/return_mean": float(masked_mean(returns, critic_mask)),
                "critic/explained_variance": explained_variance(values, returns, critic_mask),
                "critic/advantage_mean": float(masked_mean(raw_adv, M)),
                "critic/advantage_std": float(masked_mean((raw_adv - masked_mean(raw_adv, M)) ** 2, M).sqrt()),
                "critic/bootstrapped_rows": float(batch.truncated.sum()),
                "rollout/batch_rows": float(batch.batch_size),
                "rollout/batch_tokens": float(batch.num_tokens),
                "rollout/sampled_tokens": float(M.sum()),
                "perf/step_time_s": t_end - t_step,
                "perf/update_time_s": t_end - t_update,
                # backbones trained: the actor's (after warm-up) and a separate critic's; a shared
                # critic trains only its head, on the scoring pass's features
                "perf/update_tokens_per_s": batch.num_tokens * u.epochs
                * (int(step >= p.critic_warmup_steps) + int(p.critic_backbone == "separate"))
                / max(1e-9, t_end - t_update),
            })
            if kl_ref is not None:
                metrics["actor/kl_ref"] = kl_ref
            dump = dict(batch=batch, logprobs=old_logprobs, advantages=advantages, values=values, returns=returns)
            last_val = after_step(session, step + 1, metrics, episodes, dump, policy, modules, optimizers,
                                  schedulers, bar) or last_val
    finally:
        bar.close()
        driver.close()
    return last_val


def log_validation(session: Session, policy: Any, step: int) -> dict[str, float]:
    """Validate (greedy, val split), log ``val/*`` at ``step`` (= RL steps completed) and, when
    ``log.rollouts_every`` is on, save every validation episode as ``rollouts/val_<6-digit step>.jsonl``
    (``vagent.runs.samples.save_validation``; docs/viewer.md)."""
    from vagent.recipes.rollouts import validation_rollout, validation_turns
    from vagent.runs import StepProgress
    from vagent.runs.samples import save_validation

    # plain lines (the RL bar may be live): every 20 s of a long validation, with ETA, and at its end
    turns = validation_turns(session.cfg)
    progress = StepProgress(turns, f"validation @ step {step}", session.console, enabled=False, every=turns,
                            interval_s=20.0)
    with generation_mode(session.loaded.model):
        result = validation_rollout(policy, session.cfg, progress)
    metrics = result.metrics
    session.logger.log(step, metrics, phase="rl")
    if session.cfg.log.rollouts_every:
        save_validation(session.run.rollouts, step, result.episodes, session.cfg.log.rollouts_max_mb)
    session.console.print(
        f"validation @ step {step}: success {metrics.get('val/success_rate', 0):.3f}, "
        f"return {metrics.get('val/return', 0):.3f}, format {metrics.get('val/format_accuracy', 0):.3f} "
        f"({metrics['val/time_s']:.1f}s)"
    )
    return metrics


def after_step(session: Session, done: int, metrics: dict, episodes: Any, dump: dict, policy: Any,
               modules: dict, optimizers: dict, schedulers: dict, bar: Any) -> dict[str, float] | None:
    """After RL step ``done`` (1..steps): log its metrics, validate on the ``val.every`` schedule,
    save its rollouts and token rows (``dump``: the trained batch and its per-token arrays), then
    checkpoint and redraw plots on their schedules; returns the validation metrics if it ran.
    Everything labelled ``done`` is written before checkpoint ``done`` (a resume keeps it)."""
    from vagent.runs import plot_run, save_checkpoint, save_rollouts, save_token_rows
    from vagent.runs.rundir import due

    cfg, log = session.cfg, session.cfg.log
    session.logger.log(done, metrics, phase="rl")
    errors = [e for e in episodes if e.error is not None]
    if errors:  # counted in rollout/errors and left out of the batch; say what happened
        first = errors[0].error.strip().splitlines()
        session.console.print(f"step {done}: {len(errors)} episode(s) failed and were left out; first: "
                              f"{first[0]} ... {first[-1] if len(first) > 1 else ''}")
    shown = {"reward": "reward/mean", "success": "rollout/success_rate", "policy_loss": "loss/policy",
             "value_loss": "loss/value"}
    shown_values = {name: metrics[k] for name, k in shown.items() if k in metrics}
    if "actor/updated" in metrics:  # PPO: is the actor still in the critic's warm-up?
        warmup = cfg.ppo.critic_warmup_steps
        shown_values["actor"] = "updated" if metrics["actor/updated"] else f"critic-warm-up({done}/{warmup})"
        if warmup and metrics["actor/updated"] and done == warmup + 1:
            session.console.print(f"RL step {done}: the critic's warm-up is over ({warmup} step(s)); the actor "
                                  "updates from this step on")
    bar.update(done, shown_values)
    val = log_validation(session, policy, done) if due(cfg.val.every, done, cfg.steps) else None
    if due(log.rollouts_every, done, cfg.steps):  # the episodes update `done` trained on, for `vagent view`
        save_rollouts(session.run.rollouts, done, episodes, log.rollouts_n, log.rollouts_max_mb)
        save_token_rows(session.run.rollouts, done, log, dump.pop("batch"), session.loaded.encoder, **dump)
    if done == cfg.steps or due(log.checkpoint_every, done, cfg.steps):  # the last step always
        ck = save_checkpoint(
            session.run.checkpoints, "rl", done, modules, optimizers, schedulers,
            data_position={"rl_step": done}, keep_last=log.keep_last,
            export=policy_export(session, modules["policy"]),
        )
        session.last_checkpoint = str(ck)
    if due(log.plot_every, done, cfg.steps):
        plot_run(session.run.metrics, session.run.plots)
    return val
