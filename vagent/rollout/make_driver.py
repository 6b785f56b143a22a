"""``make_driver``: the rollout driver of a run config's ``rollout`` section, decided here once.

The driver runs the run's training rollout (:class:`~vagent.rollout.loop.TrainRollout`),
built here from the run config, the reasoning judges and the run's last checkpoint. The default (in
process, lockstep, no overlap) gets a :class:`~vagent.rollout.driver.RolloutDriver` on the recipe's
own policy; engine replicas, vLLM, the async schedule and overlap get one on their
generator; ``rollout.max_staleness >= 1`` gets the
:class:`~vagent.rollout.streaming.StreamingDriver`. The drivers themselves are documented in
:mod:`vagent.rollout.driver` and :mod:`vagent.rollout.streaming`.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from vagent.rollout.driver import RolloutDriver, is_default
from vagent.rollout.policy import Policy
from vagent.rollout.replicas import FreshModel, PushedEngine, engine_replicas, saved_model_dir, vllm_settings
from vagent.rollout.schedule import ScheduleLog, read_schedule, schedule_digest
from vagent.rollout.streaming import StreamingDriver
from vagent.rollout.loop import LastCheckpoint, TrainRollout

if TYPE_CHECKING:
    import torch

    from vagent.models.loading import LoadedModel
    from vagent.rewards import ReasoningReward
    from vagent.runconfig import RunConfig
    from vagent.rollout.canary import WeightCanary


def make_driver(cfg: RunConfig, loaded: LoadedModel, policy: Policy, judge: ReasoningReward | None,
                last_checkpoint: LastCheckpoint, model_dir: str | Path | None = None,
                fresh_model: FreshModel | None = None, canary: WeightCanary | None = None,
                run_root: str | Path | None = None, first_step: int = 0) -> RolloutDriver:
    """The driver of a run config's ``rollout`` section, decided here once (``is_default``;
    ``rollout.max_staleness >= 1``: the streaming driver, ``vagent.rollout.streaming``), running
    the run's ``TrainRollout`` of ``loaded.model`` scored by ``judge`` (the reasoning judges, or
    None); ``last_checkpoint``: the run's newest checkpoint, named when the policy's weights turn
    non-finite. ``policy`` is the recipe's in-process ``HFPolicy`` (the one that generates on the
    default path). ``fresh_model()``: an unsharded copy of the policy (``Session.load_fresh_model``),
    needed by engine replicas in a job of several ranks. ``canary``: the weight-push check of a
    generator apart from the trainer (run at start-up and after every push). ``run_root``: where
    a streaming run records its schedule; ``first_step``: the updates done when the run starts
    (a resume's)."""
    from vagent.rollout.hf_policy import HFPolicy

    settings = cfg.rollout
    run = TrainRollout(cfg, loaded.model, judge, last_checkpoint)
    if is_default(settings):
        return RolloutDriver(run, policy, steps=cfg.steps)
    owns_ray, engine = False, None
    max_context = cfg.model.max_context_tokens  # model.max_context_tokens: a turn beyond it ends the episode
    if settings.replicas >= 1:
        engine, owns_ray = engine_replicas(cfg, loaded, fresh_model, model_dir)
        gen_policy = HFPolicy(engine, per_request_seeds=True, max_context_tokens=max_context)
    elif settings.engine == "vllm":
        from vagent.models.vllm_engine import VLLMEngine

        engine = VLLMEngine(saved_model_dir(model_dir), loaded.encoder, colocate=True, **vllm_settings(cfg, loaded))
        if settings.schedule == "async":
            from vagent.models.batching import BatchingEngine

            gen_policy = HFPolicy(BatchingEngine(engine), per_request_seeds=True, max_context_tokens=max_context)
        else:
            gen_policy = HFPolicy(engine, per_request_seeds=True, max_context_tokens=max_context)
    else:  # in process, asynchronous
        gen_policy = HFPolicy(loaded, prefix_cache=settings.prefix_cache, per_request_seeds=True, batching=True,
                              max_context_tokens=max_context)
    if settings.max_staleness >= 1 and engine is not None:
        driver: RolloutDriver = _streaming_driver(cfg, run, gen_policy, engine, loaded.model, owns_ray, canary,
                                                  run_root, first_step)
    else:
        driver = RolloutDriver(run, gen_policy, engine=engine, model=loaded.model, overlap=settings.overlap,
                               steps=cfg.steps, owns_ray=owns_ray, canary=canary)
    try:  # vLLM loaded model_dir, which may predate SFT: the trainer's weights, version 0
        driver.start(push=settings.engine == "vllm")
    except BaseException:
        driver.close()
        raise
    return driver


def _streaming_driver(cfg: RunConfig, run: TrainRollout, policy: Policy, engine: PushedEngine, model: torch.nn.Module,
                      owns_ray: bool, canary: WeightCanary | None, run_root: str | Path | None,
                      first_step: int) -> RolloutDriver:
    """The ``StreamingDriver`` of ``rollout.max_staleness``: recording its schedule under
    ``run_root`` (from ``first_step`` on), replaying ``rollout.replay_schedule`` when set."""
    settings = cfg.rollout
    from vagent.distributed import world

    log = (ScheduleLog(run_root, schedule_digest(asdict(cfg)), settings.max_staleness,
                       resume_at=first_step or None)
           if run_root is not None and world().is_main else None)  # every rank holds the gathered batch
    replay = read_schedule(settings.replay_schedule) if settings.replay_schedule else None
    kw = dict(engine=engine, model=model, max_staleness=settings.max_staleness, steps=cfg.steps, owns_ray=owns_ray,
              canary=canary, log=log, replay=replay, first_step=first_step, deadline_s=settings.generate_timeout_s)
    if settings.batch_order == "completion":
        from vagent.rollout.completion import CompletionDriver

        return CompletionDriver(run, policy, too_stale=settings.too_stale, group_size=settings.group_size, **kw)
    return StreamingDriver(run, policy, **kw)  # type: ignore[arg-type]


__all__ = ["make_driver"]
