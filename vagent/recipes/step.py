"""What PPO and GRPO share around their step: the rollout set-up (``StepLoop``), the training
rollout (``train_rollout``), the token batch and its reward-variance filter (``filter_groups``), the KL to the reference (``reference_kl``), the engine/trainer gap (``off_policy``: ratio anchor,
rollout correction, mismatch metrics), the update's context, the step's metrics record
(``step_metrics``), validation, and the step's tail (log, validate, save samples, checkpoint, plot).

``ppo.py`` and ``grpo.py`` differ in their models, advantages, update and own metrics (PPO's
critic); what both do is here, once.
"""

from __future__ import annotations

import contextlib
from dataclasses import asdict, replace
from typing import TYPE_CHECKING, Any, Iterator

import torch
from torch import Tensor

from vagent.distributed import generation_mode
from vagent.recipes.common import sampling_for, train_env_specs
from vagent.recipes.session import Session
from vagent.recipes.sharding import policy_export
from vagent.recipes.stages import (
    Advantages, OffPolicy, PPOAdvantages, PPOScores, Scores, StepClock, StepOutcome, TrainState,
)
from vagent.recipes.update import UpdateContext
from vagent.recipes.validation import reward_metrics, validation_rollout, validation_turns
from vagent.rl.advantages import masked_mean
from vagent.rl.correction import CorrectionSettings, correct, k3_kl, mismatch_metrics
from vagent.rl.filters import variance_filter
from vagent.rl.losses import kl_penalty
from vagent.rollout.batch import NoTrainableEpisodesError, TokenBatch, build_token_batch
from vagent.rollout.canary import WeightCanary, default_tolerance, probe_for_run
from vagent.rollout.driver import InFlight, RolloutDriver, close_env_factories, is_default, make_driver
from vagent.rollout.hf_policy import HFPolicy
from vagent.rollout.loop import RolloutResult, rollout_on_ranks
from vagent.rollout.records import error_headline
from vagent.runs import StepProgress, load_object, plot_run, save_checkpoint, save_rollouts, save_token_rows
from vagent.runs.errors import NonFiniteError, TrainingError, check_module_finite
from vagent.runs.rundir import due
from vagent.runs.samples import save_validation

if TYPE_CHECKING:
    from vagent.recipes.config import GRPOConfig, PPOConfig, RunConfig, UpdateConfig
    from vagent.rewards import ReasoningReward


def batch_mode(cfg: RunConfig) -> str:
    """The ``build_token_batch`` mode of the rollout settings."""
    if cfg.rollout.mode == "no_concat":
        return "no_concat"
    return "window" if cfg.rollout.window is not None else "concat"


def start_rollouts(session: Session, reasoning: ReasoningReward | None) -> tuple[HFPolicy, RolloutDriver]:
    """(the in-process policy validation (and the default rollout) uses, the driver of the
    training rollouts).

    Where training rollouts are generated follows ``rollout.engine / replicas / schedule /
    overlap``; on the default path ``StepLoop.rollout`` calls ``train_rollout`` with this policy
    itself, and the driver only closes it. ``reasoning``: the run's reasoning reward (judges), or
    None."""
    cfg, loaded = session.cfg, session.loaded
    policy = HFPolicy(loaded, prefix_cache=cfg.rollout.prefix_cache, max_context_tokens=cfg.model.max_context_tokens)
    driver = make_driver(cfg, loaded, policy,
                         lambda pol, k, unshard: train_rollout(session, pol, k, reasoning, unshard=unshard),
                         model_dir=session.model_dir, fresh_model=session.load_fresh_model,
                         canary=weight_canary(session))
    return policy, driver


def weight_canary(session: Session) -> WeightCanary | None:
    """The weight-push canary of a run whose generator has weights of its own (engine replicas or
    vLLM; ``rollout.canary``), on the run's probe (``<run>/canary_probe.pt``), with the tolerance
    of ``rollout.canary_tolerance`` or the engine's and trainer's dtypes; None otherwise."""
    cfg = session.cfg
    settings = cfg.rollout
    if not settings.canary or (settings.replicas == 0 and settings.engine == "hf"):
        return None
    prompts, note = probe_for_run(session.run.root, train_env_specs(cfg, 0), session.loaded.encoder)
    trainer = str(next(session.loaded.model.parameters()).dtype).removeprefix("torch.")
    engine = trainer if settings.engine_dtype == "auto" else settings.engine_dtype
    tolerance = settings.canary_tolerance or default_tolerance(engine, trainer)
    session.console.print(f"weight canary: after every push the engine ({engine}) and the trainer ({trainer}) score "
                          f"{note}; a log-prob gap over {tolerance:g} stops the run")
    return WeightCanary(prompts, session.loaded.model, tolerance, lambda: session.last_checkpoint)


class StepLoop:
    """The frame of an RL loop, as a context manager: the rollout set-up (``start_rollouts``) and
    progress bar on entry; on exit the bar, the driver and the remote envs' connection pools
    (``close_env_factories``) closed, also when the set-up itself fails after the driver started
    (no Ray cluster or engine is left running); a resume (``resume_from``) of an overlapped run
    hands the checkpoint's in-flight rollout back to the driver (``resume_in_flight``);
    ``steps()`` validates at step 0 (the policy after SFT) on a fresh run, then yields the number
    of updates done before each step; ``finish(outcome, state)`` runs the step's tail and keeps the
    last validation's metrics."""

    policy: HFPolicy
    driver: RolloutDriver
    bar: StepProgress

    def __init__(self, session: Session, start_step: int, resume_from: str | None = None) -> None:
        self.session, self.start_step, self.resume_from = session, start_step, resume_from
        self.last_val: dict[str, float] = {}
        self.reasoning: ReasoningReward | None = None

    def __enter__(self) -> StepLoop:
        cfg = self.session.cfg
        self.reasoning = self.session.reasoning_reward()
        self.policy, self.driver = start_rollouts(self.session, self.reasoning)
        try:
            if self.resume_from is not None and cfg.rollout.overlap:
                resume_in_flight(self.session, self.driver, self.resume_from, self.start_step)
            self.bar = StepProgress(cfg.steps, cfg.recipe.upper(), self.session.console, cfg.log.progress,
                                    start=self.start_step)
        except BaseException:
            self.driver.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.bar.close()
        finally:
            try:
                self.driver.close()
            finally:
                close_env_factories()  # the remote env entries' connection pools

    def steps(self) -> Iterator[int]:
        cfg = self.session.cfg
        if cfg.val.every and self.start_step == 0:  # step 0: the policy before RL (after SFT)
            self.last_val = log_validation(self.session, self.policy, 0)
        yield from range(self.start_step, cfg.steps)  # `step` updates done; this one makes RL step step + 1

    def rollout(self, step: int) -> RolloutResult:
        """The training episodes of RL step ``step + 1``: on the default path (in process,
        lockstep, no overlap) ``train_rollout`` with the loop's policy, called here; otherwise the
        driver's (engine replicas, vLLM, the async schedule, overlap: ``vagent.rollout.driver``)."""
        if is_default(self.session.cfg.rollout):
            return train_rollout(self.session, self.policy, step, self.reasoning)
        return self.driver.get(step)

    def finish(self, outcome: StepOutcome, state: TrainState) -> None:
        self.last_val = after_step(self.session, outcome, self.policy, state, self.bar, self.driver) or self.last_val


def resume_in_flight(session: Session, driver: RolloutDriver, checkpoint: str, step: int) -> None:
    """Give an overlapped run's driver the rollout its checkpoint had in flight (``inflight.pt``,
    read as data), so step ``step + 1`` trains on the episodes the uninterrupted run trained on,
    sampled with the same (one update older) weights. A checkpoint without one (the last step of a
    run whose ``steps`` the resume raised, or an older vagent's) resumes with fresh episodes, and
    the console says so; a record of another step or another run (``InFlight.run_id`` against
    run.json's) is a one-line CheckpointError (the checkpoint choice skips such a checkpoint
    already: ``vagent.runs.checkpoint.identity_problem``)."""
    from vagent.runs.checkpoint import CheckpointError, in_flight_problem

    saved = load_object(checkpoint, "inflight")
    if saved is None:
        if step < session.cfg.steps:
            session.console.print(f"note: {checkpoint} holds no in-flight rollout (it was the run's last step before "
                                  f"`steps` was raised, or an older vagent wrote it): step {step + 1} samples with the "
                                  "checkpoint's weights (rollout/weights_lag 0), where an uninterrupted run would have "
                                  "sampled it one update earlier")
        return
    problem = in_flight_problem(saved, step, _run_id(session))
    if problem is None and not isinstance(saved, InFlight):
        problem = f"inflight.pt holds a {type(saved).__name__}, not the in-flight rollout vagent saves"
    if problem is not None:
        raise CheckpointError(f"{checkpoint}: its {problem}; the checkpoint was not written by this run. Restore it "
                              "from a copy of the run directory, or resume from an earlier checkpoint.")
    driver.resume_in_flight(saved, step)


def _run_id(session: Session) -> str | None:
    """The run id in the run directory's run.json (None without one: an older vagent's run)."""
    from vagent.runs.identity import read_run_identity

    identity = read_run_identity(session.run.root)
    return identity.run_id if identity is not None else None


def train_rollout(session: Session, policy: Any, step: int, reasoning: ReasoningReward | None,
                  unshard: bool = True) -> RolloutResult:
    """The training rollout of RL ``step`` (sampled, train-split seeds of the step). ``unshard``: the
    policy generates with the trainer's model, gathered once for the rollout when sharded (False
    for a separate generator: engine replicas or vLLM, which leave the trainer's parameters alone).
    If generation fails because the policy's weights hold NaN/inf, say so (NonFiniteError) instead
    of a sampler error."""
    cfg = session.cfg
    try:
        with generation_mode(session.loaded.model) if unshard else contextlib.nullcontext():
            return rollout_on_ranks(train_env_specs(cfg, step), policy, sampling_for(cfg, step),
                                    group_size=cfg.rollout.group_size, max_turns=cfg.rollout.max_turns,
                                    mode=cfg.rollout.mode, window=cfg.rollout.window, judge=reasoning,
                                    schedule=cfg.rollout.schedule)
    except RuntimeError as exc:
        check_module_finite(session.loaded.model, "policy weights", "rl", step, session.last_checkpoint)
        if "inf" in str(exc).lower() or "nan" in str(exc).lower():
            raise NonFiniteError("the policy's next-token probabilities during the rollout (the weights are "
                                 "finite but the forward pass overflowed)", float("nan"), "rl", step,
                                 session.last_checkpoint) from exc
        raise


def token_batch(session: Session, episodes: RolloutResult) -> TokenBatch:
    """The episodes' token rows (concat / window / no_concat, as configured) on the run's device;
    TrainingError (one line, naming the episodes' error) when no episode can be trained on."""
    pad = session.loaded.encoder.pad_token_id
    try:
        return build_token_batch(episodes, mode=batch_mode(session.cfg), pad_token_id=pad).to(session.device)
    except NoTrainableEpisodesError as exc:
        raise TrainingError(str(exc)) from exc


def filter_groups(batch: TokenBatch, settings: GRPOConfig | PPOConfig) -> tuple[TokenBatch, float, dict[str, float]]:
    """(kept rows of the batch, advantage scale, filter/* metrics) of the reward-variance filter
    ``settings.filter`` / ``filter_value`` (the recipe's: ``cfg.grpo`` or ``cfg.ppo``), over the
    groups' trajectory returns (``batch.episode_returns``)."""
    if settings.filter == "none":
        return batch, 1.0, {}
    trajs, row_traj = torch.unique(batch.traj_ids, return_inverse=True)
    first = torch.full((trajs.numel(),), batch.batch_size, dtype=torch.long, device=row_traj.device)
    first = first.scatter_reduce(0, row_traj, torch.arange(batch.batch_size, device=row_traj.device), "amin")
    result = variance_filter(batch.episode_returns[first], batch.group_ids[first], settings.filter,
                             settings.filter_value)
    keep_traj = torch.zeros(trajs.numel(), dtype=torch.bool, device=row_traj.device)
    keep_traj[result.kept_indices.to(row_traj.device)] = True
    rows = keep_traj[row_traj].nonzero()[:, 0]
    return batch.select(rows), result.scale, result.metrics


def reference_kl(scores: Scores, M: Tensor, settings: UpdateConfig) -> Tensor | None:
    """[B, L] the per-token KL of pi_old to the reference (``update.kl_kind``) on M (0 elsewhere), or
    None without a reference model: PPO puts it in the rewards (``update.kl_in: reward``); both
    recipes log its mean over M (``actor/kl_ref``)."""
    if scores.ref_logprobs is None:
        return None
    return kl_penalty(scores.old_logprobs, scores.ref_logprobs, settings.kl_kind) * M


def update_context(session: Session, step: int, temperature: float) -> UpdateContext:
    """Where and how the update of RL step ``step + 1`` runs (``step`` updates done before it)."""
    return UpdateContext(session.device, session.bf16, session.cfg.seed, step, session.last_checkpoint, temperature)


def step_metrics(cfg: RunConfig, episodes: RolloutResult, batch: TokenBatch, scores: Scores, estimate: Advantages,
                 stats: dict[str, float], clock: StepClock, own: dict[str, float], backbones: int) -> dict[str, float]:
    """An RL step's record (docs/metrics.md), in this order: rollout, reward, filter, mismatch and
    loss/optim ``stats``, the trainer's log-prob gap, the recipe's ``own`` metrics (PPO's critic/,
    GRPO's advantage size), the batch's, the timings and the KL to the reference. ``backbones``:
    backbone passes the update ran per token and epoch (perf/update_tokens_per_s)."""
    M = batch.loss_mask
    metrics = {**episodes.metrics, **reward_metrics(episodes), **stats}
    metrics.update({
        "actor/logprob_diff": float(masked_mean((scores.old_logprobs - batch.old_logprobs).abs(), M)),
        **own,
        "rollout/batch_rows": float(batch.batch_size),
        "rollout/batch_tokens": float(batch.num_tokens),
        "rollout/sampled_tokens": float(M.sum()),
        "perf/step_time_s": clock.step_s,
        "perf/update_time_s": clock.update_s,
        "perf/update_tokens_per_s": batch.num_tokens * cfg.update.epochs * backbones / max(1e-9, clock.update_s),
    })
    if estimate.kl_ref is not None:
        metrics["actor/kl_ref"] = estimate.kl_ref
    return metrics


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
    """
    engine, trainer, M = batch.old_logprobs, scores.old_logprobs, batch.loss_mask
    if cfg.rollout.overlap:
        metrics = {"mismatch/behaviour_proximal_kl": k3_kl(trainer, engine, M)}
    else:
        metrics = mismatch_metrics(trainer, engine, M, image_context(batch, image_token_id))
    settings = CorrectionSettings(**asdict(cfg.rollout_correction))
    if not settings.active:
        anchor = engine * M if cfg.rollout.overlap else trainer
        return OffPolicy(anchor, None, M, metrics)
    fix = correct(trainer, engine, M, settings)
    return OffPolicy(trainer, fix.weights, fix.mask, metrics | fix.metrics)


def log_validation(session: Session, policy: HFPolicy, step: int) -> dict[str, float]:
    """Validate (greedy, val split), log ``val/*`` at ``step`` (= RL steps completed) and, when
    ``log.rollouts_every`` is on, save every validation episode as ``rollouts/val_<6-digit step>.jsonl``
    (``vagent.runs.samples.save_validation``; docs/viewer.md)."""
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


def after_step(session: Session, outcome: StepOutcome, policy: HFPolicy, state: TrainState,
               bar: StepProgress, driver: RolloutDriver | None = None) -> dict[str, float] | None:
    """After RL step ``outcome.step`` (1..steps): log its metrics, validate on the ``val.every``
    schedule, save its rollouts and token rows, then checkpoint and redraw plots on their
    schedules; returns the validation metrics if it ran. Everything labelled with the step is
    written before that step's checkpoint (a resume keeps it), and so is the ``driver``'s rollout
    in flight (``rollout.overlap: 1``: the next step's episodes, ``inflight.pt``)."""
    cfg, log, step = session.cfg, session.cfg.log, outcome.step
    session.logger.log(step, outcome.metrics, phase="rl")
    report_errors(session, outcome)
    bar.update(step, shown_values(session, outcome))
    val = log_validation(session, policy, step) if due(cfg.val.every, step, cfg.steps) else None
    if due(log.rollouts_every, step, cfg.steps):  # the episodes update `step` trained on, for `vagent view`
        save_rollouts(session.run.rollouts, step, outcome.episodes, log.rollouts_n, log.rollouts_max_mb)
        scores, estimate = outcome.scores, outcome.advantages
        save_token_rows(session.run.rollouts, step, log, outcome.batch, session.loaded.encoder,
                        logprobs=scores.old_logprobs, advantages=estimate.advantages,
                        values=scores.values if isinstance(scores, PPOScores) else None,
                        returns=estimate.returns if isinstance(estimate, PPOAdvantages) else None)
    if step == cfg.steps or due(log.checkpoint_every, step, cfg.steps):  # the last step always
        in_flight = driver.in_flight() if driver is not None else None
        if in_flight is not None:  # the run that sampled it: a resume refuses another run's
            in_flight = replace(in_flight, run_id=_run_id(session))
        ck = save_checkpoint(
            session.run.checkpoints, "rl", step, state.modules, state.optimizers, state.schedulers,
            data_position={"rl_step": step}, keep_last=log.keep_last,
            export=policy_export(session, state.modules["policy"]), objects={"inflight": in_flight},
        )
        session.last_checkpoint = str(ck)
    if log.plots and due(log.plot_every, step, cfg.steps):
        plot_run(session.run.metrics, session.run.plots)
    return val


def report_errors(session: Session, outcome: StepOutcome) -> None:
    """Episodes that failed are counted in rollout/errors and left out of the batch: say what happened."""
    errors = [e for e in outcome.episodes if e.error is not None]
    if errors:
        session.console.print(f"step {outcome.step}: {len(errors)} episode(s) failed and were left out; first: "
                              f"{error_headline(errors[0].error)}")


#: the progress bar's fields and the metrics they show
_SHOWN = {"reward": "reward/mean", "success": "rollout/success_rate", "policy_loss": "loss/policy",
          "value_loss": "loss/value"}


def shown_values(session: Session, outcome: StepOutcome) -> dict[str, float | str]:
    """The progress bar's values of a step; PPO's also say whether the actor is still in the critic's
    warm-up (and the console says when it ends)."""
    cfg, metrics, step = session.cfg, outcome.metrics, outcome.step
    shown: dict[str, float | str] = {name: metrics[k] for name, k in _SHOWN.items() if k in metrics}
    if "actor/updated" in metrics:
        warmup = cfg.ppo.critic_warmup_steps
        shown["actor"] = "updated" if metrics["actor/updated"] else f"critic-warm-up({step}/{warmup})"
        if warmup and metrics["actor/updated"] and step == warmup + 1:
            session.console.print(f"RL step {step}: the critic's warm-up is over ({warmup} step(s)); the actor "
                                  "updates from this step on")
    return shown
