"""The multi-turn rollout: envs x group size episodes, one batched policy call per turn.

``rollout(env_specs, policy, sampling, group_size=G, max_turns=T, mode=...)`` runs every
:class:`EnvSpec` ``G`` times (one group: same env, seed and config; ``group_id`` = the spec's
index, ``traj_id`` = ``spec_index * G + g``, unique). Each turn:

1. every active episode gets the conversation of its next sample (see *Context modes*);
2. ``policy.act(conversations, sampling_t)`` is called ONCE for all active episodes, with
   ``sampling_t.seed = sampling.seed * 1_000_003 + t`` (so a turn's draws depend only on the
   base seed, the turn and the batch, never on how many rollouts the policy ran before);
3. all envs step concurrently in a thread pool (envs may be remote), each recording
   ``state_before = env.state()``, ``env.step(reply.text)``, ``state_after = env.state()``;
4. a :class:`Turn` is recorded.

An episode ends when the env says ``terminated`` or ``truncated``, or after ``max_turns`` turns
(then ``Episode.truncated = True``: a limit, not a terminal state); ``final_observation`` keeps
the observation after the last step, and token-level policies encode it in
``Episode.final_segment`` for the critic's bootstrap. ``Turn.truncated`` is the env's own flag.

Failures are errors, never rewards (docs/algorithms.md reference bug 8): a ``Reply.error`` marks the episode
``error = "policy: ..."`` and stops it without stepping the env; an exception in
``reset``/``step``/``state`` marks it ``error = "env: <traceback>"``. Errored episodes are kept in
the returned list (counted in ``rollout/errors``) and excluded by ``build_token_batch``. A reply
with ``finish_reason == "context_limit"`` (the policy's context limit would be exceeded) ends the
episode as truncated before that turn, with the unanswered observation as ``final_observation``.

Parsed replies: envs are authoritative. If ``info["parsed"]`` is a ``ParsedResponse`` (or its
dict, from a remote env), ``Turn.parsed`` is that; otherwise the loop parses the reply with
``vagent.envs.formats.parse_response`` and the env's ``config.format`` /
``config.max_actions_per_turn`` and ``action_sep`` (attribute of the env or its config).

Context modes (docs/algorithms.md reference section 4):

- ``mode="concat"`` (window None): one Conversation per episode holding the whole history
  ``[system][obs_0][act_0][obs_1][act_1]...``; one training row per episode.
- ``mode="concat", window=k``: each turn is its own sample whose context is the system prompt,
  the last ``k`` completed turns (observation + reply) and the current observation; one training
  row per turn, so the training context equals the rollout context (legacy rolled out windowed
  but trained on the full history). Earlier replies appear as mask-0 copies of their sampled
  token ids (never re-encoded); whole turns are dropped, so an image never loses its tokens.
- ``mode="no_concat"``: each turn's context is the system prompt plus the current observation
  (= ``window=0``); one row per turn.

``Episode.samples`` holds the sample conversations (one, or one per turn). For token-level
policies each sample's ``k``-th sampled segment is a turn: in concat mode turn ``k``, in a
per-turn sample the sample's own turn; earlier replies in window samples are mask-0 copies.

``reasoning_reward(episodes) -> dict[str, float]`` (optional, ``vagent.rewards``) runs after the
rollout on the episodes without error; it adds to ``turn.reward`` and fills
``reasoning_rewards``/``reasoning_scores``; its metrics are merged into ``result.metrics``, with
its seconds as ``perf/judge_time_s`` (:func:`vagent.rollout.finish.judge_episodes`, a stage of its
own: the training rollout calls it per rank, before the episodes are gathered).

The result is a list of episodes (:class:`RolloutResult`, a ``list`` subclass) whose ``metrics``
attribute holds :func:`rollout_metrics` plus ``perf/`` timings and the reasoning-reward metrics.

Asynchronous schedule (``schedule="async"``, :mod:`vagent.rollout.async_loop`): the steps above
without the per-turn barrier; each trajectory runs in its own thread and asks the (thread-safe,
batching) policy for one reply at a time, with the same turn seeds. Same episodes as lockstep
(greedy, or sampled with per-request seeds; tested). Each conversation carries ``key =
traj_id`` (replica routing, per-request seeds) and each ``Turn`` the ``weights_version`` of the
engine that sampled it.

Ranks (:func:`rollout_on_ranks`): in a job of several ranks, rank r plays a contiguous block of
the env specs (a spec is one GRPO/GiGPO group, so a group stays whole on one rank and its
statistics need no gathering), samples with a rank-derived seed, and gathers every rank's
episodes, renumbered to the single-process group/trajectory ids and in spec order. Every rank then
holds the whole batch: advantages, whitening, filters and ``reward/*``, ``rollout/*`` and ``val/*``
metrics are computed over the global batch exactly as in one process.

The training rollout of an RL step (:class:`TrainRollout`, which ``make_driver`` builds and the
rollout driver calls once per step): the step's train-split envs (``specs.train_env_specs``) and
sampling (``specs.sampling_for``) through :func:`rollout_on_ranks`, scored by the reasoning judges.
"""

from __future__ import annotations

import contextlib
import dataclasses
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from vagent.rollout.async_loop import rollout_async
from vagent.rollout.finish import RolloutClock, RolloutResult, finish_rollout, judge_episodes, rollout_metrics
from vagent.rollout.policy import Policy, SamplingConfig
from vagent.rollout.records import Episode
from vagent.rollout.trajectory import (
    MODES, SCHEDULES, EnvFactory, EnvSpec, Live, act, apply_reply, check_args, close_env, new_lives,
    next_conversation, record_turn, start_env, step_env,
)
from vagent.rollout.specs import sampling_for, train_env_specs
from vagent.seeds import derive_seed

if TYPE_CHECKING:  # torch, the judges and the run config stay out of `import vagent.rollout.loop`
    import torch

    from vagent.rewards import ReasoningReward
    from vagent.runconfig import RunConfig

__all__ = ["EnvSpec", "LastCheckpoint", "RolloutResult", "TrainRollout", "rollout", "rollout_on_ranks", "rollout_metrics", "merge_rollouts",
           "spec_blocks", "MODES", "SCHEDULES"]


def rollout(
    env_specs: Sequence[EnvSpec],
    policy: Policy,
    sampling: SamplingConfig,
    *,
    group_size: int = 1,
    max_turns: int,
    mode: str = "concat",
    window: int | None = None,
    reasoning_reward: Callable[[list[Episode]], Mapping[str, float]] | None = None,
    max_workers: int = 16,
    env_factory: EnvFactory | None = None,
    schedule: str = "lockstep",
    on_turn: Callable[[int, int], None] | None = None,
) -> RolloutResult:
    """Roll out ``len(env_specs) * group_size`` episodes (see the module docstring).

    Args:
        env_specs: the envs; each is run ``group_size`` times (one group per spec).
        policy: anything with ``act(conversations, sampling) -> list[Reply]``; a policy with
            ``needs_envs = True`` (``SolverPolicy``) is called as ``act(convs, sampling, envs=...)``.
        sampling: sampling parameters (``max_new_tokens`` is the per-turn token budget).
        group_size: rollouts per spec (GRPO's n).
        max_turns: the turn limit (reaching it truncates the episode).
        mode: ``"concat"`` or ``"no_concat"``; window: turns of history per sample (concat only).
        reasoning_reward: optional ``(episodes) -> metrics`` applied after the rollout.
        max_workers: threads stepping envs concurrently.
        env_factory: optional ``(spec) -> Env`` used for specs without their own ``factory``.
        schedule: ``"lockstep"`` (one batched policy call per turn) or ``"async"`` (each
            trajectory advances on its own; see *Asynchronous schedule*).
        on_turn: optional ``(turns_done, episodes_running)`` called after each lockstep turn
            (progress displays); the asynchronous schedule has no turn boundary and does not call it.
    Returns:
        :class:`RolloutResult`: the episodes in (spec, group member) order, with ``.metrics``.
    """
    if schedule == "async":
        return judge_episodes(rollout_async(env_specs, policy, sampling, group_size=group_size, max_turns=max_turns,
                                            mode=mode, window=window, env_factory=env_factory), reasoning_reward)
    if schedule != "lockstep":
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    window = check_args(env_specs, group_size, max_turns, mode, window, policy)
    clock = RolloutClock(getattr(getattr(policy, "engine", None), "stats", None))  # HFEngine's prefix-reuse counters
    lives = new_lives(env_specs, group_size)
    with ThreadPoolExecutor(max_workers=max(1, min(max_workers, len(lives) or 1))) as pool:
        try:
            clock.timed("env", lambda: list(pool.map(lambda lv: start_env(lv, env_factory), lives)))
            for t in range(max_turns):
                if not _turn(pool, lives, policy, sampling, t, max_turns, window, clock):
                    break
                if on_turn is not None:
                    on_turn(t + 1, sum(not lv.finished for lv in lives))
        finally:
            list(pool.map(close_env, lives))
    return judge_episodes(finish_rollout(lives, policy, clock, tokens_per="generate"), reasoning_reward)


def _turn(pool: ThreadPoolExecutor, lives: list[Live], policy: Policy, sampling: SamplingConfig, t: int,
          max_turns: int, window: int | None, clock: RolloutClock) -> bool:
    """Turn ``t`` of the episodes still running: one policy call for all, their envs stepped in
    ``pool``, the turns recorded in order. False when no episode was running."""
    active = [lv for lv in lives if not lv.finished]
    if not active:
        return False
    for lv in active:
        next_conversation(lv, window)
    replies = clock.timed("gen", act, policy, active, sampling, t)
    stepping = [(lv, reply) for lv, reply in zip(active, replies) if apply_reply(lv, reply, window)]
    texts = [reply.text for _, reply in stepping]
    results = clock.timed("env", lambda: list(pool.map(step_env, [lv for lv, _ in stepping], texts)))
    for (lv, reply), stepped in zip(stepping, results):
        if stepped is not None:
            record_turn(lv, t, reply, stepped, max_turns, window)
    return True


def spec_blocks(n_specs: int, n_ranks: int) -> list[tuple[int, int]]:
    """[lo, hi) of the specs each rank plays: contiguous, sizes differing by at most one."""
    base, extra = divmod(n_specs, n_ranks)
    out, lo = [], 0
    for r in range(n_ranks):
        hi = lo + base + (1 if r < extra else 0)
        out.append((lo, hi))
        lo = hi
    return out


#: the reasoning-reward stage (a ``vagent.rewards.ReasoningReward``): finished episodes -> its metrics
Judge = Callable[[list[Episode]], Mapping[str, float]]


def rollout_on_ranks(specs: Sequence[EnvSpec], policy: Policy, sampling: SamplingConfig, *, group_size: int = 1,
                     judge: Judge | None = None, local: bool = False, **kw: Any) -> RolloutResult:
    """:func:`rollout` of ``specs``, shared between the ranks of a job (see *Ranks* in the
    module docstring), then the reasoning-reward stage: ``judge`` (a ``ReasoningReward``, or None)
    scores each rank's own episodes (``judge_episodes``) before they are gathered. One process, or
    ``local`` (this rank plays every spec and gathers nothing: a completion-order group):
    ``judge_episodes(rollout(specs, ...), judge)``."""
    from vagent.distributed import gather_objects, world  # heavy (torch): API-only evaluation imports this module

    job = world()
    if local or not job.distributed:
        return judge_episodes(rollout(specs, policy, sampling, group_size=group_size, **kw), judge)
    lo, hi = spec_blocks(len(specs), job.size)[job.rank]
    mine = RolloutResult([], {})
    if hi > lo:  # ranks draw from different streams (the same seed would reuse one rank's noise)
        sampling = dataclasses.replace(sampling, seed=derive_seed(sampling.seed, "rank", job.rank))
        mine = judge_episodes(rollout(list(specs[lo:hi]), policy, sampling, group_size=group_size, **kw), judge)
    for ep in mine:  # the single-process ids: group = spec index, trajectory = group * size + member
        member = ep.traj_id - ep.group_id * group_size
        ep.group_id += lo
        ep.traj_id = ep.group_id * group_size + member
    parts = gather_objects((list(mine), mine.metrics), "rollout episodes")
    return merge_rollouts(parts, str(kw.get("schedule", "lockstep")))


def merge_rollouts(parts: Sequence[tuple[list[Episode], Mapping[str, float]]], schedule: str) -> RolloutResult:
    """One rollout of ``parts`` (each its episodes and metrics: a job's ranks, or the groups of a
    completion-order batch) that ran at the same time: ``rollout_metrics`` of all the episodes, a
    timing (``*_time_s``) the slowest part's, any other metric the episode-weighted mean (reasoning
    judges' means, prompt-cache fraction), and the token rate over the timing that bounds it."""
    episodes = [ep for eps, _ in parts for ep in eps]
    metrics = rollout_metrics(episodes)
    n = [len(eps) for eps, _ in parts]
    for key in sorted({k for _, m in parts for k in m} - set(metrics)):
        vals = [(m[key], k) for (_, m), k in zip(parts, n) if key in m]
        if key.endswith("_time_s"):  # the parts roll out at the same time: the step waits for the slowest
            metrics[key] = max(v for v, _ in vals)
        else:
            metrics[key] = sum(v * k for v, k in vals) / max(1, sum(k for _, k in vals))
    # lockstep: generation time is wall time; async: it is summed over overlapping trajectories,
    # so the rate divides by the rollout's wall time (each the slowest part's)
    clock = "perf/rollout_time_s" if schedule == "async" else "perf/generate_time_s"
    if clock in metrics:
        tokens = sum(len(t.sampled_token_ids) for e in episodes for t in e.turns)
        metrics["perf/rollout_tokens_per_s"] = tokens / max(1e-9, metrics[clock])
    return RolloutResult(episodes, metrics)


# --- the training rollout of an RL step ----------------------------------------------------------


@dataclass
class LastCheckpoint:
    """The run's newest checkpoint (the one the loop started after, then each one it writes), named
    by a NonFiniteError or a failed weight push as the last good one; calling it gives the path."""

    path: str | None = None

    def __call__(self) -> str | None:
        return self.path


@dataclass(frozen=True)
class TrainRollout:
    """The training rollout of an RL step: the step's train-split env seeds and sampling, the
    reasoning judges (``judge``, or None), the envs split over the ranks of a job.

    ``rollout(policy, updates_done, unshard)``: the episodes of RL step ``updates_done + 1``;
    ``unshard``: the policy generates with the trainer's ``model``, gathered once for the rollout
    when sharded (False for a separate generator: engine replicas or vLLM, which leave the
    trainer's parameters alone). If generation fails because the weights hold NaN/inf, it says so
    (NonFiniteError, naming ``last_checkpoint``) instead of a sampler error."""

    cfg: RunConfig
    model: torch.nn.Module
    judge: ReasoningReward | None
    last_checkpoint: LastCheckpoint

    def groups(self, step: int) -> int:
        """How many env groups the rollout of ``step`` holds (its env seeds)."""
        return len(train_env_specs(self.cfg, step))

    def share(self, step: int) -> range:
        """The trajectory ids (as one process numbers them) that this rank plays in the rollout of
        ``step``: every one in one process, a contiguous block of whole groups in a job."""
        from vagent.distributed import world  # torch, as below

        job, size = world(), self.cfg.rollout.group_size  # outside a job: rank 0 of 1
        lo, hi = spec_blocks(self.groups(step), job.size)[job.rank]
        return range(lo * size, hi * size)

    def __call__(self, policy: Policy, step: int, unshard: bool, group: int | None = None) -> RolloutResult:
        """The rollout of ``step`` (``group``: only its env group ``group``, on sampling seeds of its
        own, as group 0 of a one-group rollout played by this rank alone: ``rollout.batch_order:
        completion``, whose job ranks each play groups of their own)."""
        from vagent.distributed import generation_mode  # torch: `import vagent.rollout` stays light

        cfg, updates_done = self.cfg, step  # the driver's `step`: the updates done
        specs, sampling = train_env_specs(cfg, updates_done), sampling_for(cfg, updates_done)
        if group is not None:
            specs = [specs[group]]
            sampling = dataclasses.replace(sampling, seed=derive_seed(sampling.seed, "group", group))
        try:
            with generation_mode(self.model) if unshard else contextlib.nullcontext():
                return rollout_on_ranks(specs, policy, sampling, group_size=cfg.rollout.group_size, max_turns=cfg.rollout.max_turns,
                                        mode=cfg.rollout.mode, window=cfg.rollout.window, judge=self.judge,
                                        schedule=cfg.rollout.schedule, local=group is not None)
        except RuntimeError as exc:
            from vagent.runs.errors import NonFiniteError, check_module_finite  # torch, as above

            # named by the weights' age: after `updates_done` updates ("rl step 0": the policy before RL)
            # this rank's failure alone: no collective (the other ranks may not be here)
            check_module_finite(self.model, "policy weights", "rl", updates_done, self.last_checkpoint.path,
                                across_ranks=False)
            if "inf" in str(exc).lower() or "nan" in str(exc).lower():
                raise NonFiniteError("the policy's next-token probabilities during the rollout (the weights are "
                                     "finite but the forward pass overflowed)", float("nan"), "rl", updates_done,
                                     self.last_checkpoint.path) from exc
            raise
