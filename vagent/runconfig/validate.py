"""Checks of a loaded run config beyond its types: :func:`validate` (every number's range, the run
name, the rules between fields) and :func:`validate_envs` (each env entry, and the boards a tiny
model is caption-pretrained on, against its env's declared Config)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Sequence

from vagent.config import ConfigError, field_types, from_mapping
from vagent.runconfig.ranges import check_name, check_ranges
from vagent.runconfig.sections import EnvEntry, ModelConfig, RunConfig

if TYPE_CHECKING:
    from vagent.envs.latency import StepLatency


def need(cond: bool, msg: str) -> None:
    """Raise ConfigError(msg) unless ``cond`` holds."""
    if not cond:
        raise ConfigError(msg)


def check_model_shape(cfg: RunConfig) -> None:
    """The tiny model's head size (tiny_hidden / tiny_heads) is an even whole number >= 8."""
    model = cfg.model
    need(model.tiny_hidden % model.tiny_heads == 0 and (model.tiny_hidden // model.tiny_heads) % 2 == 0
         and model.tiny_hidden // model.tiny_heads >= 8,
         f"model.tiny_hidden / model.tiny_heads is the head size and must be an even whole number >= 8, got "
         f"{model.tiny_hidden} / {model.tiny_heads}; e.g. tiny_hidden 128 with tiny_heads 4 (head size 32).")


def check_steps(cfg: RunConfig) -> None:
    need(cfg.steps >= 0, f"steps must be >= 0, got {cfg.steps}.")


def check_env_counts(cfg: RunConfig) -> None:
    """At least one env entry; each trains on >= 1 env (SFT aside) and validates on >= 0."""
    need(len(cfg.envs) > 0, "envs is empty: list at least one env, e.g. envs: [{name: frozenlake}].")
    for i, entry in enumerate(cfg.envs):
        need(entry.n_train >= 1 or cfg.recipe == "sft", f"envs.{i}.n_train must be >= 1, got {entry.n_train}.")
        need(entry.n_val >= 0, f"envs.{i}.n_val must be >= 0, got {entry.n_val}.")


def check_rollout(cfg: RunConfig) -> None:
    """Positive episode sizes; overlap 0 or 1, and 1 only with a generator that has its own weights."""
    rollout = cfg.rollout
    need(rollout.group_size >= 1, f"rollout.group_size must be >= 1, got {rollout.group_size}.")
    need(rollout.max_turns >= 1, f"rollout.max_turns must be >= 1, got {rollout.max_turns}.")
    need(rollout.max_new_tokens >= 1, f"rollout.max_new_tokens must be >= 1, got {rollout.max_new_tokens}.")
    need(rollout.replicas >= 0 and rollout.replica_threads >= 1,
         f"rollout.replicas must be >= 0 and rollout.replica_threads >= 1, got {rollout.replicas}, "
         f"{rollout.replica_threads}.")
    need(rollout.push_timeout_s > 0 and rollout.generate_timeout_s > 0,
         f"rollout.push_timeout_s and rollout.generate_timeout_s are deadlines in seconds and must be > 0, got "
         f"{rollout.push_timeout_s}, {rollout.generate_timeout_s}; defaults 600 and 1800 (docs/distributed.md).")
    need(rollout.overlap in (0, 1),
         f"rollout.overlap must be 0 or 1 (staleness of the generator's weights), got {rollout.overlap}.")
    need(not (rollout.overlap and rollout.engine == "hf" and rollout.replicas == 0),
         "rollout.overlap 1 generates while the trainer updates, so the generator needs its own weights: set "
         "rollout.replicas >= 1 (Ray actors) or rollout.engine vllm, or rollout.overlap 0.")
    check_streaming(cfg)
    check_canary(cfg)
    check_replica_resources(cfg)


#: resources Ray asks for through their own actor options (num_cpus, num_gpus, memory), never ``resources``
_RAY_BUILTIN_RESOURCES = ("CPU", "GPU", "memory", "object_store_memory")


def check_replica_resources(cfg: RunConfig) -> None:
    """``rollout.replica_resources``: Ray custom resource names with quantities Ray accepts (> 0,
    whole above 1), and only where engine replicas run (replicas >= 1)."""
    rollout, example = cfg.rollout, "e.g. {vagent_replica: 1} with `ray start --resources '{\"vagent_replica\": 2}'`"
    resources = rollout.replica_resources
    if not resources:
        return
    need(rollout.replicas >= 1, f"rollout.replica_resources {resources} pins engine replicas to Ray nodes, and "
                                "rollout.replicas is 0: set rollout.replicas >= 1, or drop rollout.replica_resources.")
    for name, qty in resources.items():
        need(isinstance(name, str) and bool(name) and name not in _RAY_BUILTIN_RESOURCES,
             f"rollout.replica_resources: {name!r} is not a Ray custom resource name (a non-empty string other than "
             f"{', '.join(_RAY_BUILTIN_RESOURCES)}, which Ray allots by its own options); {example}.")
        number = isinstance(qty, (int, float)) and not isinstance(qty, bool)
        need(number and 0 < qty < float("inf") and (qty <= 1 or float(qty).is_integer()),
             f"rollout.replica_resources.{name} must be a number > 0, a whole number when above 1 (Ray's rule), "
             f"got {qty!r}; {example}.")


def check_streaming(cfg: RunConfig) -> None:
    """``rollout.max_staleness`` K >= 1 only with engine replicas and overlap 0;
    ``rollout.replay_schedule`` only on a streaming run, naming a schedule of this config."""
    rollout = cfg.rollout
    k = rollout.max_staleness
    need(isinstance(k, int) and k >= 0,
         f"rollout.max_staleness must be an integer >= 0 (updates a batch's oldest token may be behind; 0 = off), "
         f"got {k!r}.")
    if k:
        need(rollout.replicas >= 1,
             f"rollout.max_staleness {k} streams rollouts on engine replicas while the trainer updates and pushes "
             "weights mid-rollout: set rollout.replicas >= 1 (Ray actors; engine hf or vllm), or max_staleness 0.")
        need(not rollout.overlap,
             f"rollout.max_staleness {k} replaces rollout.overlap 1 (K = 1 is its schedule, with weights pushed "
             "mid-rollout): set rollout.overlap 0.")
    if rollout.batch_order != "step":
        need(k >= 1, f"rollout.batch_order {rollout.batch_order} forms batches from the groups of every rollout in "
                     "flight, which only a streaming run has: set rollout.max_staleness >= 1 (with rollout.replicas "
                     f">= 1), or batch_order step (got max_staleness {k}).")
    if rollout.too_stale != "drop":
        need(rollout.batch_order == "completion",
             f"rollout.too_stale {rollout.too_stale} decides what happens to a group older than max_staleness, which "
             "only rollout.batch_order completion can take (step order bounds every batch by construction): set "
             "rollout.batch_order completion, or drop rollout.too_stale.")
    if rollout.interrupt:
        need(k >= 1,
             "rollout.interrupt stops replies mid-generation when a weight push lands, which happens only on a "
             "streaming run's engine replicas (rollout.engine hf or vllm): set rollout.max_staleness >= 1 with "
             f"rollout.replicas >= 1, or drop it (got max_staleness {k}, engine {rollout.engine}).")
        need(not rollout.replay_schedule,
             "rollout.interrupt splits replies where pushes happen to land, which a recorded schedule does not "
             "hold: drop rollout.interrupt to replay, or rollout.replay_schedule to stream with it.")
    if rollout.replay_schedule:
        need(k >= 1, f"rollout.replay_schedule {rollout.replay_schedule} replays a streaming run's schedule: set "
                     "rollout.max_staleness to the recorded run's K, or drop rollout.replay_schedule.")
        from vagent.rollout.schedule import ScheduleError, read_schedule, replay_problem, schedule_digest

        try:
            recorded = read_schedule(rollout.replay_schedule)
        except ScheduleError as exc:
            raise ConfigError(f"{exc}.") from None
        need(recorded.max_staleness == k,
             f"rollout.replay_schedule {rollout.replay_schedule} was recorded with rollout.max_staleness "
             f"{recorded.max_staleness}, this config has {k}: set it to {recorded.max_staleness}.")
        problem = replay_problem(rollout.replay_schedule, schedule_digest(dataclasses.asdict(cfg)))
        need(problem is None, f"{problem}.")


def check_canary(cfg: RunConfig) -> None:
    """``rollout.canary_tolerance`` set where no canary runs is refused, as every field set where it
    has no effect (rollout.engine_dtype, envs.N.token): the canary needs ``rollout.canary`` and a
    generator apart from the trainer (replicas >= 1 or engine vllm)."""
    rollout = cfg.rollout
    if rollout.canary_tolerance is None:
        return
    need(rollout.canary, f"rollout.canary_tolerance {rollout.canary_tolerance} is the weight canary's tolerance, and "
                         "rollout.canary is false: set rollout.canary true, or drop rollout.canary_tolerance.")
    need(rollout.replicas >= 1 or rollout.engine == "vllm",
         f"rollout.canary_tolerance {rollout.canary_tolerance} is the weight canary's tolerance, and this run has no "
         "canary: it checks a generator apart from the trainer, and this run generates with the trainer's own model. "
         "Set rollout.replicas >= 1 (or rollout.engine vllm), or drop rollout.canary_tolerance.")


def check_env_servers(cfg: RunConfig) -> None:
    """Each entry's urls are http(s) URLs, a token comes with urls, and a latency is a StepLatency."""
    for i, entry in enumerate(cfg.envs):
        bad = [url for url in entry.urls if not str(url).startswith(("http://", "https://"))]
        need(not bad, f"envs.{i}.urls must be http(s) URLs of vagent serve-env servers, got {bad}.")
        need(entry.token is None or bool(entry.urls), f"envs.{i}.token is the bearer token of envs.{i}.urls; set "
             "urls too (the env servers), or drop the token.")
    check_env_latency(cfg)


def env_latency(entry: EnvEntry, index: int) -> StepLatency | None:
    """``envs.<index>.latency`` as a :class:`~vagent.envs.latency.StepLatency` (None when null);
    an unknown field or a bad value raises a one-line ConfigError naming ``envs.<index>.latency``."""
    if entry.latency is None:
        return None
    from vagent.envs.latency import StepLatency  # lazy: the config loads without the env package

    where = f"envs.{index}.latency"
    try:
        return from_mapping(StepLatency, entry.latency, where=where)
    except ConfigError as exc:  # StepLatency's own checks do not know the key they were written under
        raise ConfigError(str(exc) if str(exc).startswith(where) else f"{where}: {exc}") from None


def check_env_latency(cfg: RunConfig) -> None:
    """Each entry's ``latency`` maps onto StepLatency (known fields, valid values)."""
    for i, entry in enumerate(cfg.envs):
        env_latency(entry, i)


def check_update(cfg: RunConfig) -> None:
    """Epochs, mini-batches and micro-batch budget; PPO clip bounds; a positive actor learning rate."""
    update = cfg.update
    need(update.mini_batches >= 1 and update.epochs >= 1, "update.epochs and update.mini_batches must be >= 1.")
    need(update.micro_batch_tokens >= 16,
         f"update.micro_batch_tokens must be >= 16, got {update.micro_batch_tokens}.")
    need(0 <= update.clip_low < 1 and update.clip_high >= 0, "update.clip_low must be in [0, 1) and clip_high >= 0.")
    need(update.dual_clip is None or update.dual_clip > 1,
         f"update.dual_clip must be > 1 or null, got {update.dual_clip}.")
    need(update.actor_lr > 0, f"update.actor_lr must be > 0, got {update.actor_lr}.")


def check_ppo(cfg: RunConfig) -> None:
    """Recipe ppo: the estimator fits rollout.mode; a group filter needs groups of >= 2."""
    if cfg.recipe != "ppo":
        return
    ppo, rollout = cfg.ppo, cfg.rollout
    if rollout.mode == "no_concat" and ppo.estimator != "no_concat_gae":
        raise ConfigError(
            f"rollout.mode is no_concat but ppo.estimator is {ppo.estimator}: each turn is its "
            "own sample there, so only ppo.estimator=no_concat_gae links the turns. Set "
            "ppo.estimator=no_concat_gae or rollout.mode=concat."
        )
    if rollout.mode == "concat" and ppo.estimator == "no_concat_gae":
        raise ConfigError("ppo.estimator=no_concat_gae needs rollout.mode=no_concat.")
    if ppo.filter != "none":
        need(0 < ppo.filter_value <= 1, f"ppo.filter_value must be in (0, 1], got {ppo.filter_value}.")
        need(rollout.group_size >= 2, "ppo.filter compares the rewards within a group: set rollout.group_size >= 2 "
             f"(got {rollout.group_size}) or ppo.filter none.")


def check_grpo(cfg: RunConfig) -> None:
    """Recipe grpo: groups of >= 2, the filter's fraction and gigpo's discount in range."""
    if cfg.recipe != "grpo":
        return
    grpo = cfg.grpo
    need(cfg.rollout.group_size >= 2, "recipe grpo needs rollout.group_size >= 2 (advantages are relative to "
         f"the group), got {cfg.rollout.group_size}.")
    need(0 < grpo.filter_value <= 1, f"grpo.filter_value must be in (0, 1], got {grpo.filter_value}.")
    need(0 <= grpo.gigpo_gamma <= 1, f"grpo.gigpo_gamma must be in [0, 1], got {grpo.gigpo_gamma}.")


def check_model_inputs(cfg: RunConfig) -> None:
    """Image pixel bounds ordered; the context limit leaves room for a turn's reply."""
    model = cfg.model
    for name in ("min_pixels", "max_pixels", "max_context_tokens"):
        value = getattr(model, name)
        need(value is None or value >= 1, f"model.{name} must be >= 1 or null, got {value}.")
    need(model.min_pixels is None or model.max_pixels is None or model.min_pixels <= model.max_pixels,
         f"model.min_pixels ({model.min_pixels}) must be <= model.max_pixels ({model.max_pixels}).")
    max_new = cfg.rollout.max_new_tokens
    need(model.max_context_tokens is None or model.max_context_tokens > max_new,
         f"model.max_context_tokens ({model.max_context_tokens}) must exceed rollout.max_new_tokens ({max_new}): "
         "a turn needs room for its prompt and its reply.")


def check_hub(cfg: RunConfig) -> None:
    need(cfg.hub.every >= 1, f"hub.every must be >= 1, got {cfg.hub.every}.")
    need(not cfg.hub.repo_id or cfg.hub.repo_id.count("/") == 1,
         f"hub.repo_id must look like OWNER/NAME, got {cfg.hub.repo_id!r}.")


def check_grpo_kl(cfg: RunConfig) -> None:
    """Recipe grpo with a KL term: the KL goes in the loss."""
    if cfg.recipe == "grpo" and cfg.update.kl_coef > 0 and cfg.update.kl_in != "loss":
        raise ConfigError("recipe grpo puts the KL in the loss: set update.kl_in=loss (or update.kl_coef=0).")


def check_sft(cfg: RunConfig) -> None:
    """Recipe sft has steps; batch size, random-action fraction and answer weight in range."""
    sft = cfg.sft
    if cfg.recipe == "sft":
        need(sft.steps > 0, "recipe sft needs sft.steps > 0.")
    need(sft.batch_size >= 1, f"sft.batch_size must be >= 1, got {sft.batch_size}.")
    need(0 <= sft.random_action_frac <= 1, "sft.random_action_frac must be in [0, 1].")
    need(sft.answer_weight > 0, f"sft.answer_weight must be > 0 (1 = plain token mean), got {sft.answer_weight}.")


def check_log(cfg: RunConfig) -> None:
    need(cfg.log.keep_last >= 1, f"log.keep_last must be >= 1, got {cfg.log.keep_last}.")


def check_rollout_correction(cfg: RunConfig) -> None:
    """An accepted ratio band that is not empty and, with rejection on, holds ratio 1 (a token the
    engine and the trainer score alike: outside the band every token of an exact run is rejected and
    the update has no loss); an engine dtype only where the generator has its own weights (engine
    replicas or vLLM)."""
    corr, rollout = cfg.rollout_correction, cfg.rollout
    need(corr.rs_low is None or corr.rs_low < corr.rs_high,
         f"rollout_correction.rs_low ({corr.rs_low}) must be below rollout_correction.rs_high ({corr.rs_high}): "
         "tokens whose ratio pi_trainer / pi_engine leaves [rs_low, rs_high] are rejected; e.g. rs_low 0.5, "
         "rs_high 2.0 (null rs_low = 1 / rs_high).")
    low = corr.rs_low if corr.rs_low is not None else 1 / corr.rs_high
    need(corr.rs_level == "none" or low <= 1 <= corr.rs_high,
         f"rollout_correction accepts ratios pi_trainer / pi_engine in [{low:g}, {corr.rs_high:g}] (rs_low "
         f"{'null = 1 / rs_high' if corr.rs_low is None else corr.rs_low}, rs_high {corr.rs_high}), which excludes 1: "
         f"rs_level {corr.rs_level} would reject the tokens the engine and the trainer agree on, and with them "
         "every token of a run without mismatch. Set rs_low <= 1 <= rs_high, e.g. rs_low 0.5, rs_high 2.0.")
    need(rollout.engine_dtype == "auto" or rollout.replicas >= 1 or rollout.engine == "vllm",
         f"rollout.engine_dtype {rollout.engine_dtype} sets the dtype of a generator apart from the trainer, and "
         "this run generates with the trainer's own model: set rollout.replicas >= 1 (or rollout.engine vllm), "
         "or rollout.engine_dtype auto.")


def check_reasoning_reward(cfg: RunConfig) -> None:
    """``reasoning_reward`` parses as :class:`vagent.rewards.reasoning.ReasoningRewardConfig` (an
    unknown key fails here, before any model work, not after SFT) and every number in it is finite
    (a NaN or inf weight would give NaN turn rewards)."""
    if not cfg.reasoning_reward:
        return
    import dataclasses
    import math

    from vagent.config import from_mapping
    from vagent.rewards.reasoning import ReasoningRewardConfig  # not at the top: vagent --help stays light

    parsed = from_mapping(ReasoningRewardConfig, cfg.reasoning_reward, where="reasoning_reward")
    stack: list[tuple[str, dict[str, Any] | list[Any]]] = [("reasoning_reward", dataclasses.asdict(parsed))]
    while stack:
        where, node = stack.pop()
        for key, value in (node.items() if isinstance(node, dict) else enumerate(node)):
            if isinstance(value, (dict, list)):
                stack.append((f"{where}.{key}", value))
            elif isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"{where}.{key} must be a finite number, got {value}: a NaN or infinite weight "
                                  "makes every turn's reasoning reward NaN. Set a number such as 0.5 (0 turns it off).")


#: below this a temperature divides the logits into inf (1e-320 passes the [0, 100] range); 0 is greedy
MIN_TEMPERATURE = 1e-3
#: a run name's UTF-8 bytes: the folder <name>-<YYYYmmdd-HHMMSS>-<n> must fit a file name (255 bytes)
MAX_NAME_BYTES = 200


def check_inputs(cfg: RunConfig) -> None:
    """Values that pass their ranges yet fail later: a temperature between 0 and
    :data:`MIN_TEMPERATURE`; a run name too long for a folder name or not valid UTF-8."""
    t = cfg.rollout.temperature
    need(t == 0 or t >= MIN_TEMPERATURE,
         f"rollout.temperature must be 0 (greedy) or >= {MIN_TEMPERATURE}, got {t}: dividing the logits by it "
         "overflows to inf. Set 0 for greedy rollouts.")
    try:
        size = len(cfg.name.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise ConfigError(f"name {cfg.name!r} is not valid UTF-8 text (a lone surrogate at position {exc.start}); "
                          "set name= to a plain folder name such as frozenlake-ppo.") from exc
    need(size <= MAX_NAME_BYTES, f"name is {size} bytes of UTF-8; at most {MAX_NAME_BYTES} fit the run directory's "
                                 f"folder name (<name>-<time>): set a shorter name=.")


#: the rules between fields, in the order they run (the first that fails raises). model, envs and
#: grpo have two each, kept in this order so that a config with several errors names the same one first
SECTION_CHECKS = (check_model_shape, check_steps, check_env_counts, check_rollout, check_env_servers, check_update,
                  check_ppo, check_grpo, check_model_inputs, check_hub, check_grpo_kl, check_sft, check_log,
                  check_rollout_correction)


def validate(cfg: RunConfig) -> RunConfig:
    """Check every number's range (:data:`vagent.runconfig.ranges.RANGES`), the run name and the
    rules between fields (:data:`SECTION_CHECKS`); raise ConfigError naming the field and the fix."""
    check_ranges(cfg)
    check_inputs(cfg)  # before check_name: a name that is not UTF-8 cannot be printed in its message
    check_name(cfg.name)
    for check in SECTION_CHECKS:
        check(cfg)
    check_reasoning_reward(cfg)
    return cfg


#: env fields of the caption-pretraining boards (then ``image_size`` = ``model.tiny_image_size``,
#: then ``model.tiny_pretrain_env_config``); fields an env does not declare are left out
PRETRAIN_ENV_DEFAULTS = {"format": "grounding_worldmodeling", "render": "vision", "description_style": "symbolic"}


def pretrain_env_entries(model: ModelConfig, envs: Sequence[EnvEntry]) -> list[EnvEntry]:
    """The envs a tiny model is caption-pretrained on: each env name of the run once, in order,
    with the model's own env settings (:data:`PRETRAIN_ENV_DEFAULTS`, ``image_size`` =
    ``tiny_image_size``, then ``tiny_pretrain_env_config``), not the run's env config: the
    captions, and so the model, stay the same when the run changes how its envs render."""
    from vagent.envs.registry import env_class  # lazy: the registry loads PIL

    out = []
    for name in dict.fromkeys(entry.name for entry in envs):
        declared = field_types(env_class(name).Config)
        defaults = {**PRETRAIN_ENV_DEFAULTS, "image_size": model.tiny_image_size}
        config = {key: value for key, value in defaults.items() if key in declared}
        out.append(EnvEntry(name=name, config={**config, **model.tiny_pretrain_env_config}))
    return out


def validate_envs(cfg: RunConfig) -> RunConfig:
    """Check every ``envs.N`` entry against its env's declared Config (names, keys, types, limits),
    so that a typo fails here, before a model is built; raise ConfigError naming the entry. An
    entry served by ``vagent serve-env`` (``urls``) whose env is not registered in this process is
    left to its server to check."""
    from vagent.envs.registry import list_envs, make_config  # lazy: the registry loads PIL

    for i, entry in enumerate(cfg.envs):
        if entry.urls and entry.name not in list_envs():
            continue
        try:
            make_config(entry.name, **entry.config)
        except KeyError as exc:  # unknown env name: the message lists the registered ones
            raise ConfigError(f"envs.{i}.name: {str(exc).strip(chr(34) + chr(39))}") from exc
        except (ConfigError, ValueError, TypeError) as exc:
            raise ConfigError(f"envs.{i}.config: {exc}") from exc
    model = cfg.model
    if model.path == "tiny" and model.tiny_pretrain_steps > 0:  # the caption boards' envs, before the build
        local = [entry for entry in cfg.envs if not entry.urls or entry.name in list_envs()]
        for entry in pretrain_env_entries(model, local):
            try:
                make_config(entry.name, **entry.config)
            except (ConfigError, ValueError, TypeError) as exc:
                raise ConfigError(f"model.tiny_pretrain_env_config ({entry.name} caption boards): {exc}") from exc
    return cfg
