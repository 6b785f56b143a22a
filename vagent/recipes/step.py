"""What PPO and GRPO share around their step: the set-up (``rl_models``: reference model, critic,
sharding, optimizers, schedules), the frame of the loop (``StepLoop``: the rollout driver, the
progress bar, the step's tail) and the step's metrics record (``step_metrics``). The driver
(``vagent.rollout.make_driver``) builds and runs the training rollout itself
(``vagent.rollout.loop.TrainRollout``). The stages both recipes run alike on the step's
records are in ``stages.py``. ``ppo.py`` and ``grpo.py`` differ in their models, advantages, update
and own metrics (PPO's critic).

Two counts, never mixed: ``updates_done`` (0..steps-1, what seeds a step's rollout and mini-batch
order) and ``rl_step = updates_done + 1`` (1..steps, what metrics, rollouts, checkpoints and update
errors carry).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Collection, Iterator, Literal

import torch

from vagent.distributed import generation_mode
from vagent.models.value import ReferenceModel, ValueModel, build_critic, reference_model
from vagent.recipes.optim import make_optimizer, make_scheduler
from vagent.recipes.session import Session
from vagent.recipes.sharding import policy_export, policy_to_copy, shard_for_training
from vagent.recipes.stages import BatchLayout, StepOutcome, TrainState
from vagent.recipes.update import Learner, UpdateContext
from vagent.recipes.validation import reward_metrics, validation_rollout, validation_turns
from vagent.rl.advantages import masked_mean
from vagent.rollout.canary import WeightCanary, default_tolerance, probe_for_run
from vagent.rollout.driver import InFlight, RolloutDriver, close_env_factories
from vagent.rollout.make_driver import make_driver
from vagent.rollout.hf_policy import HFPolicy
from vagent.rollout.loop import LastCheckpoint, RolloutResult, TrainRollout  # noqa: F401 -- TrainRollout's old home
from vagent.rollout.records import error_headline
from vagent.rollout.specs import train_env_specs
from vagent.runs import StepProgress, load_object, plot_run, save_checkpoint, save_rollouts, save_token_rows
from vagent.runs.rundir import due
from vagent.runs.samples import save_validation

if TYPE_CHECKING:
    from vagent.runconfig import RunConfig
    from vagent.rewards import ReasoningReward
    from vagent.runs import Console


def batch_mode(cfg: RunConfig) -> str:
    """The ``build_token_batch`` mode of the rollout settings."""
    if cfg.rollout.mode == "no_concat":
        return "no_concat"
    return "window" if cfg.rollout.window is not None else "concat"


# --- set-up ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RLModels:
    """What PPO and GRPO set up alike before their first step: the reference model (with a KL
    term), the critic (PPO), each role's trainer (``learners``: "actor", and PPO's "critic") and
    ``state`` (modules, optimizers and schedules by name: what a checkpoint holds)."""

    ref: ReferenceModel | None
    critic: ValueModel | None
    learners: dict[str, Learner]
    state: TrainState

    def step_schedules(self, held: Collection[str] = ()) -> dict[str, float]:
        """The learning rates this step used (``optim/<role>_lr``), then one schedule step of every
        role not ``held`` (PPO holds the actor's during the critic's warm-up: its schedule starts
        with its first update)."""
        lrs = {f"optim/{role}_lr": opt.param_groups[0]["lr"] for role, opt in self.state.optimizers.items()}
        for role, schedule in self.state.schedulers.items():
            if role not in held:
                schedule.step()
        return lrs


def rl_models(session: Session, critic_backbone: Literal["shared", "separate"] | None = None) -> RLModels:
    """Build the critic (``critic_backbone``; None: no critic, GRPO) from the policy's backbone and
    the reference model (``update.kl_coef > 0``) from the policy, shard them with the policy in a
    job of several ranks, and make each role's optimizer and schedule (the actor at
    ``update.actor_lr``, the critic at ``ppo.critic_lr``; a shared critic trains its head only)."""
    cfg, settings, model = session.cfg, session.cfg.update, session.loaded.model
    source = policy_to_copy(session) if critic_backbone or settings.kl_coef > 0 else None  # one process: `loaded`
    critic = (build_critic(source, share_backbone=critic_backbone == "shared", device=session.device)
              if critic_backbone and source is not None else None)
    ref = reference_model(source) if settings.kl_coef > 0 and source is not None else None
    del source
    shard_for_training(session, critic, ref)
    modules: dict[str, torch.nn.Module] = {"policy": model}
    params = {"actor": [q for q in model.parameters() if q.requires_grad]}
    lrs = {"actor": settings.actor_lr}
    if critic is not None:
        modules["critic"] = critic
        params["critic"] = (list(critic.value_head.parameters()) if critic.shares_backbone
                            else [q for q in critic.parameters() if q.requires_grad])
        lrs["critic"] = cfg.ppo.critic_lr
    opts = {role: make_optimizer(params[role], lrs[role], settings.weight_decay) for role in params}
    schedules = {role: make_scheduler(opt, settings.warmup_steps, cfg.steps, settings.lr_schedule)
                 for role, opt in opts.items()}
    learners = {role: Learner(modules["policy" if role == "actor" else role], params[role], opts[role])
                for role in params}
    return RLModels(ref, critic, learners, TrainState(modules, dict(opts), dict(schedules)))


# --- the loop's frame ------------------------------------------------------------------------------


def start_rollouts(session: Session, judge: ReasoningReward | None, last_checkpoint: LastCheckpoint,
                   first_step: int = 0) -> tuple[HFPolicy, RolloutDriver]:
    """(the in-process policy validation uses, the driver of the training rollouts: ``make_driver``
    builds the run's ``TrainRollout`` of ``judge`` and ``last_checkpoint`` and decides once, from
    ``rollout.engine / replicas / schedule / overlap / max_staleness``, where they are generated;
    on the default path with that same policy). ``first_step``: the updates done when the loop
    starts (a streaming run's schedule record continues from it)."""
    cfg, loaded = session.cfg, session.loaded
    policy = HFPolicy(loaded, prefix_cache=cfg.rollout.prefix_cache, max_context_tokens=cfg.model.max_context_tokens)
    driver = make_driver(cfg, loaded, policy, judge, last_checkpoint, model_dir=session.model_dir,
                         fresh_model=session.load_fresh_model, canary=weight_canary(session, last_checkpoint),
                         run_root=session.run.root, first_step=first_step)
    if cfg.rollout.interrupt:
        try:
            session.console.print(interrupt_report(getattr(driver.engine, "interrupts", None)))
        except BaseException:
            driver.close()
            raise
    return policy, driver


def interrupt_report(interrupts: list[bool] | None) -> str:
    """The console line of ``rollout.interrupt`` from the replicas' own report (``ready()``: whether
    a waiting push stops their running replies); a replica that reports it off, or an engine that
    reports nothing, is a RuntimeError (the setting did not reach the generators)."""
    if not interrupts or not all(interrupts):
        off = "no report" if not interrupts else f"replicas {[i for i, on in enumerate(interrupts) if not on]} report it off"
        raise RuntimeError(f"rollout.interrupt is on but did not reach the engine replicas ({off}): a push would wait "
                           "for the replies being generated instead of stopping them. Report this with the run's "
                           "train.log.")
    n = len(interrupts)
    return (f"rollout.interrupt: {'the replica reports' if n == 1 else f'all {n} replicas report'} that a waiting push "
            "stops the replies being generated (continued on the new weights)")


def weight_canary(session: Session, last_checkpoint: LastCheckpoint) -> WeightCanary | None:
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
    return WeightCanary(prompts, session.loaded.model, tolerance, last_checkpoint)


class StepLoop:
    """The frame of an RL loop, as a context manager: the rollout set-up (``start_rollouts``) and
    progress bar on entry; on exit the bar, the driver and the remote envs' connection pools
    (``close_env_factories``) closed, also when the set-up itself fails after the driver started
    (no Ray cluster or engine is left running); a resume (``resume_from``) of an overlapped run
    hands the checkpoint's in-flight rollout back to the driver (``resume_in_flight``).

    ``steps()`` validates at RL step 0 (the policy after SFT) on a fresh run, then yields
    ``updates_done`` before each step; ``rollout`` is the driver's ``get`` on every configuration;
    ``finish`` runs the step's tail. The loop keeps the run's newest checkpoint
    (``last_checkpoint``) and hands the stages what they need of the session (``layout``,
    ``image_token_id``, ``update_context``)."""

    policy: HFPolicy
    driver: RolloutDriver
    bar: StepProgress

    def __init__(self, session: Session, updates_done: int, resume_from: str | None = None,
                 last_checkpoint: str | None = None) -> None:
        self.session, self.start, self.resume_from = session, updates_done, resume_from
        self.last_checkpoint = LastCheckpoint(last_checkpoint if last_checkpoint is not None else resume_from)
        self.last_val: dict[str, float] = {}
        encoder = session.loaded.encoder
        self.layout = BatchLayout(batch_mode(session.cfg), encoder.pad_token_id, session.device)
        self.image_token_id: int | None = encoder.image_token_id

    def __enter__(self) -> StepLoop:
        cfg = self.session.cfg
        self.policy, self.driver = start_rollouts(self.session, self.session.reasoning_reward(), self.last_checkpoint,
                                                  self.start)
        try:
            if self.resume_from is not None and (cfg.rollout.overlap or cfg.rollout.max_staleness):
                resume_in_flight(self.session, self.driver, self.resume_from, self.start)
            self.bar = StepProgress(cfg.steps, cfg.recipe.upper(), self.session.console, cfg.log.progress,
                                    start=self.start)
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
        """``updates_done`` before each RL step: this one makes RL step ``updates_done + 1``."""
        cfg = self.session.cfg
        if cfg.val.every and self.start == 0:  # RL step 0: the policy before RL (after SFT)
            self.last_val = self.validate(0)
        yield from range(self.start, cfg.steps)

    def rollout(self, updates_done: int) -> RolloutResult:
        """The episodes of RL step ``updates_done + 1``, from the driver on every configuration."""
        return self.driver.get(updates_done)

    def update_context(self, updates_done: int, temperature: float) -> UpdateContext:
        """Where and how the update of RL step ``updates_done + 1`` runs."""
        session = self.session
        return UpdateContext(session.device, session.bf16, session.cfg.seed, updates_done, self.last_checkpoint.path,
                             temperature)

    def finish(self, outcome: StepOutcome, state: TrainState) -> None:
        """After RL step ``outcome.rl_step`` (1..steps): log its metrics (``step_metrics``),
        validate on the ``val.every`` schedule, save its rollouts and token rows, then checkpoint
        and redraw plots on their schedules. Everything labelled with the step is written before
        that step's checkpoint (a resume keeps it), and so is the driver's rollout in flight
        (``rollout.overlap: 1``: the next step's episodes, ``inflight.pt``)."""
        session, cfg, rl_step = self.session, self.session.cfg, outcome.rl_step
        metrics = step_metrics(outcome, cfg.update.epochs)
        session.logger.log(rl_step, metrics, phase="rl")
        report_errors(session.console, outcome)
        self.bar.update(rl_step, shown_values(metrics, outcome.shown))
        if due(cfg.val.every, rl_step, cfg.steps):
            self.last_val = self.validate(rl_step)
        if due(cfg.log.rollouts_every, rl_step, cfg.steps):  # the episodes the update trained on, for `vagent view`
            self.save_samples(outcome)
        if rl_step == cfg.steps or due(cfg.log.checkpoint_every, rl_step, cfg.steps):  # the last step always
            self.checkpoint(rl_step, state)
        if cfg.log.plots and due(cfg.log.plot_every, rl_step, cfg.steps):
            plot_run(session.run.metrics, session.run.plots)

    def validate(self, rl_step: int) -> dict[str, float]:
        """Validate (greedy, val split), log ``val/*`` at ``rl_step`` (= RL steps completed) and, when
        ``log.rollouts_every`` is on, save every validation episode as ``rollouts/val_<6-digit step>.jsonl``
        (``vagent.runs.samples.save_validation``; docs/viewer.md)."""
        session = self.session
        # plain lines (the RL bar may be live): every 20 s of a long validation, with ETA, and at its end
        turns = validation_turns(session.cfg)
        progress = StepProgress(turns, f"validation @ step {rl_step}", session.console, enabled=False, every=turns,
                                interval_s=20.0)
        with generation_mode(session.loaded.model):
            result = validation_rollout(self.policy, session.cfg, progress)
        metrics = result.metrics
        session.logger.log(rl_step, metrics, phase="rl")
        if session.cfg.log.rollouts_every:
            save_validation(session.run.rollouts, rl_step, result.episodes, session.cfg.log.rollouts_max_mb)
        session.console.print(
            f"validation @ step {rl_step}: success {metrics.get('val/success_rate', 0):.3f}, "
            f"return {metrics.get('val/return', 0):.3f}, format {metrics.get('val/format_accuracy', 0):.3f} "
            f"({metrics['val/time_s']:.1f}s)"
        )
        return metrics

    def save_samples(self, outcome: StepOutcome) -> None:
        """The step's episodes (``rollouts/``) and token rows with their log-probs, advantages and,
        where the recipe has them, values and returns (PPO)."""
        session, log = self.session, self.session.cfg.log
        save_rollouts(session.run.rollouts, outcome.rl_step, outcome.episodes, log.rollouts_n, log.rollouts_max_mb)
        save_token_rows(session.run.rollouts, outcome.rl_step, log, outcome.batch, session.loaded.encoder,
                        logprobs=outcome.scores.old_logprobs, advantages=outcome.advantages.advantages,
                        values=outcome.values, returns=outcome.returns)

    def checkpoint(self, rl_step: int, state: TrainState) -> None:
        """The checkpoint after RL step ``rl_step``, with the driver's rollout in flight; it becomes
        the loop's ``last_checkpoint``."""
        session = self.session
        in_flight = self.driver.in_flight()  # a streaming run's: a list, one per step in flight
        run_id = _run_id(session.run.root)  # the run that sampled it: a resume refuses another run's
        if isinstance(in_flight, list):
            in_flight = [replace(rec, run_id=run_id) for rec in in_flight]
        elif in_flight is not None:
            in_flight = replace(in_flight, run_id=run_id)
        ck = save_checkpoint(
            session.run.checkpoints, "rl", rl_step, state.modules, state.optimizers, state.schedulers,
            data_position={"rl_step": rl_step}, keep_last=session.cfg.log.keep_last,
            export=policy_export(session, state.modules["policy"]), objects={"inflight": in_flight},
        )
        self.last_checkpoint.path = str(ck)


def resume_in_flight(session: Session, driver: RolloutDriver, checkpoint: str, updates_done: int) -> None:
    """Give an overlapped run's driver the rollout its checkpoint had in flight (``inflight.pt``,
    read as data), so RL step ``updates_done + 1`` trains on the episodes the
    uninterrupted run trained on, sampled with the same (one update older) weights. A checkpoint
    without one (the last step of a run whose ``steps`` the resume raised, or an older vagent's)
    resumes with fresh episodes, and the console says so; a record of another step or another run
    (``InFlight.run_id`` against run.json's) is a one-line CheckpointError (the checkpoint choice
    skips such a checkpoint already: ``vagent.runs.checkpoint.identity_problem``)."""
    from vagent.runs.checkpoint import CheckpointError, in_flight_problem

    saved = load_object(checkpoint, "inflight")
    if saved is None:
        if updates_done < session.cfg.steps:
            session.console.print(f"note: {checkpoint} holds no in-flight rollout (it was the run's last step before "
                                  "`steps` was raised, or an older vagent wrote it): "
                                  f"step {updates_done + 1} samples with the "
                                  "checkpoint's weights (rollout/weights_lag 0), where an uninterrupted run would have "
                                  "sampled it one update earlier")
        return
    problem = in_flight_problem(saved, updates_done, _run_id(session.run.root))
    if problem is None and not all(isinstance(rec, InFlight) for rec in (saved if isinstance(saved, list) else [saved])):
        problem = f"inflight.pt holds a {type(saved).__name__}, not the in-flight rollout vagent saves"
    if problem is not None:
        raise CheckpointError(f"{checkpoint}: its {problem}; the checkpoint was not written by this run. Restore it "
                              "from a copy of the run directory, or resume from an earlier checkpoint.")
    driver.resume_in_flight(saved, updates_done)


def _run_id(run_root: Path) -> str | None:
    """The run id in the run directory's run.json (None without one: an older vagent's run)."""
    from vagent.runs.identity import read_run_identity

    identity = read_run_identity(run_root)
    return identity.run_id if identity is not None else None


# --- the step's record and tail --------------------------------------------------------------------


def step_metrics(outcome: StepOutcome, epochs: int) -> dict[str, float]:
    """An RL step's record (docs/metrics.md), merged here and nowhere else, in this order: rollout,
    reward, the stages' (filter, mismatch, correction, loss/optim), the trainer's log-prob gap, the
    recipe's own (PPO's critic/, GRPO's advantage size), the batch's, the timings and the KL to the
    reference. ``epochs``: ``update.epochs`` (perf/update_tokens_per_s counts every pass)."""
    episodes, batch, clock = outcome.episodes, outcome.batch, outcome.clock
    M = batch.loss_mask
    metrics = {**episodes.metrics, **reward_metrics(episodes)}
    for part in outcome.stage_metrics:
        metrics.update(part)
    metrics.update({
        "actor/logprob_diff": float(masked_mean((outcome.scores.old_logprobs - batch.old_logprobs).abs(), M)),
        **outcome.own,
        "rollout/batch_rows": float(batch.batch_size),
        "rollout/batch_tokens": float(batch.num_tokens),
        "rollout/sampled_tokens": float(M.sum()),
        "perf/step_time_s": clock.step_s,
        "perf/update_time_s": clock.update_s,
        "perf/update_tokens_per_s": batch.num_tokens * epochs * outcome.backbones / max(1e-9, clock.update_s),
    })
    if outcome.advantages.kl_ref is not None:
        metrics["actor/kl_ref"] = outcome.advantages.kl_ref
    return metrics


def report_errors(console: Console, outcome: StepOutcome) -> None:
    """Episodes that failed are counted in rollout/errors and left out of the batch: say what happened."""
    errors = [e for e in outcome.episodes if e.error is not None]
    if errors:
        console.print(f"step {outcome.rl_step}: {len(errors)} episode(s) failed and were left out; first: "
                      f"{error_headline(errors[0].error)}")


#: the progress bar's fields and the metrics they show
_SHOWN = {"reward": "reward/mean", "success": "rollout/success_rate", "policy_loss": "loss/policy",
          "value_loss": "loss/value"}


def shown_values(metrics: dict[str, float], own: dict[str, str]) -> dict[str, float | str]:
    """The progress bar's values of a step: the metrics of ``_SHOWN`` it has, then the recipe's own
    fields (``StepOutcome.shown``: PPO's actor warm-up state)."""
    shown: dict[str, float | str] = {name: metrics[k] for name, k in _SHOWN.items() if k in metrics}
    return {**shown, **own}
