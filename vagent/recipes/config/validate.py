"""Checks of a loaded run config beyond its types: :func:`validate` (every number's range, the run
name, the rules between fields) and :func:`validate_envs` (each env entry, and the boards a tiny
model is caption-pretrained on, against its env's declared Config)."""

from __future__ import annotations

from typing import Sequence

from vagent.config import ConfigError, field_types
from vagent.recipes.config.ranges import check_name, check_ranges
from vagent.recipes.config.sections import EnvEntry, ModelConfig, RunConfig


def validate(cfg: RunConfig) -> RunConfig:
    """Check every number's range (:data:`vagent.recipes.config.ranges.RANGES`), the run name and the
    cross-field rules; raise ConfigError naming the field and the fix."""
    def need(cond: bool, msg: str) -> None:
        if not cond:
            raise ConfigError(msg)

    check_ranges(cfg)
    check_name(cfg.name)
    m = cfg.model
    need(m.tiny_hidden % m.tiny_heads == 0 and (m.tiny_hidden // m.tiny_heads) % 2 == 0
         and m.tiny_hidden // m.tiny_heads >= 8,
         f"model.tiny_hidden / model.tiny_heads is the head size and must be an even whole number >= 8, got "
         f"{m.tiny_hidden} / {m.tiny_heads}; e.g. tiny_hidden 128 with tiny_heads 4 (head size 32).")
    need(cfg.steps >= 0, f"steps must be >= 0, got {cfg.steps}.")
    need(len(cfg.envs) > 0, "envs is empty: list at least one env, e.g. envs: [{name: frozenlake}].")
    for i, e in enumerate(cfg.envs):
        need(e.n_train >= 1 or cfg.recipe == "sft", f"envs.{i}.n_train must be >= 1, got {e.n_train}.")
        need(e.n_val >= 0, f"envs.{i}.n_val must be >= 0, got {e.n_val}.")
    r = cfg.rollout
    need(r.group_size >= 1, f"rollout.group_size must be >= 1, got {r.group_size}.")
    need(r.max_turns >= 1, f"rollout.max_turns must be >= 1, got {r.max_turns}.")
    need(r.max_new_tokens >= 1, f"rollout.max_new_tokens must be >= 1, got {r.max_new_tokens}.")
    need(r.replicas >= 0 and r.replica_threads >= 1,
         f"rollout.replicas must be >= 0 and rollout.replica_threads >= 1, got {r.replicas}, {r.replica_threads}.")
    need(r.overlap in (0, 1), f"rollout.overlap must be 0 or 1 (staleness of the generator's weights), got {r.overlap}.")
    need(not (r.overlap and r.engine == "hf" and r.replicas == 0),
         "rollout.overlap 1 generates while the trainer updates, so the generator needs its own weights: set "
         "rollout.replicas >= 1 (Ray actors) or rollout.engine vllm, or rollout.overlap 0.")
    for i, e in enumerate(cfg.envs):
        bad = [u for u in e.urls if not str(u).startswith(("http://", "https://"))]
        need(not bad, f"envs.{i}.urls must be http(s) URLs of vagent serve-env servers, got {bad}.")
        need(e.token is None or bool(e.urls), f"envs.{i}.token is the bearer token of envs.{i}.urls; set urls "
             "too (the env servers), or drop the token.")
    u = cfg.update
    need(u.mini_batches >= 1 and u.epochs >= 1, "update.epochs and update.mini_batches must be >= 1.")
    need(u.micro_batch_tokens >= 16, f"update.micro_batch_tokens must be >= 16, got {u.micro_batch_tokens}.")
    need(0 <= u.clip_low < 1 and u.clip_high >= 0, "update.clip_low must be in [0, 1) and clip_high >= 0.")
    need(u.dual_clip is None or u.dual_clip > 1, f"update.dual_clip must be > 1 or null, got {u.dual_clip}.")
    need(u.actor_lr > 0, f"update.actor_lr must be > 0, got {u.actor_lr}.")
    if cfg.recipe == "ppo":
        if r.mode == "no_concat" and cfg.ppo.estimator != "no_concat_gae":
            raise ConfigError(
                f"rollout.mode is no_concat but ppo.estimator is {cfg.ppo.estimator}: each turn is its "
                "own sample there, so only ppo.estimator=no_concat_gae links the turns. Set "
                "ppo.estimator=no_concat_gae or rollout.mode=concat."
            )
        if r.mode == "concat" and cfg.ppo.estimator == "no_concat_gae":
            raise ConfigError("ppo.estimator=no_concat_gae needs rollout.mode=no_concat.")
    if cfg.recipe == "grpo":
        need(r.group_size >= 2, "recipe grpo needs rollout.group_size >= 2 (advantages are relative to "
             f"the group), got {r.group_size}.")
        need(0 < cfg.grpo.filter_value <= 1, f"grpo.filter_value must be in (0, 1], got {cfg.grpo.filter_value}.")
        need(0 <= cfg.grpo.gigpo_gamma <= 1, f"grpo.gigpo_gamma must be in [0, 1], got {cfg.grpo.gigpo_gamma}.")
    if cfg.recipe == "ppo" and cfg.ppo.filter != "none":
        need(0 < cfg.ppo.filter_value <= 1, f"ppo.filter_value must be in (0, 1], got {cfg.ppo.filter_value}.")
        need(r.group_size >= 2, "ppo.filter compares the rewards within a group: set rollout.group_size >= 2 "
             f"(got {r.group_size}) or ppo.filter none.")
    m = cfg.model
    for name in ("min_pixels", "max_pixels", "max_context_tokens"):
        need(getattr(m, name) is None or getattr(m, name) >= 1, f"model.{name} must be >= 1 or null, got {getattr(m, name)}.")
    need(m.min_pixels is None or m.max_pixels is None or m.min_pixels <= m.max_pixels,
         f"model.min_pixels ({m.min_pixels}) must be <= model.max_pixels ({m.max_pixels}).")
    need(m.max_context_tokens is None or m.max_context_tokens > r.max_new_tokens,
         f"model.max_context_tokens ({m.max_context_tokens}) must exceed rollout.max_new_tokens ({r.max_new_tokens}): "
         "a turn needs room for its prompt and its reply.")
    need(cfg.hub.every >= 1, f"hub.every must be >= 1, got {cfg.hub.every}.")
    need(not cfg.hub.repo_id or cfg.hub.repo_id.count("/") == 1,
         f"hub.repo_id must look like OWNER/NAME, got {cfg.hub.repo_id!r}.")
    if cfg.recipe == "grpo" and u.kl_coef > 0 and u.kl_in != "loss":
        raise ConfigError("recipe grpo puts the KL in the loss: set update.kl_in=loss (or update.kl_coef=0).")
    if cfg.recipe == "sft":
        need(cfg.sft.steps > 0, "recipe sft needs sft.steps > 0.")
    need(cfg.sft.batch_size >= 1, f"sft.batch_size must be >= 1, got {cfg.sft.batch_size}.")
    need(0 <= cfg.sft.random_action_frac <= 1, "sft.random_action_frac must be in [0, 1].")
    need(cfg.sft.answer_weight > 0, f"sft.answer_weight must be > 0 (1 = plain token mean), got {cfg.sft.answer_weight}.")
    need(cfg.log.keep_last >= 1, f"log.keep_last must be >= 1, got {cfg.log.keep_last}.")
    return cfg


#: env fields of the caption-pretraining boards (then ``image_size`` = ``model.tiny_image_size``,
#: then ``model.tiny_pretrain_env_config``); fields an env does not declare are left out
PRETRAIN_ENV_DEFAULTS = {"format": "grounding_worldmodeling", "render": "vision", "description_style": "symbolic"}


def pretrain_env_entries(m: ModelConfig, envs: Sequence[EnvEntry]) -> list[EnvEntry]:
    """The envs a tiny model is caption-pretrained on: each env name of the run once, in order,
    with the model's own env settings (:data:`PRETRAIN_ENV_DEFAULTS`, ``image_size`` =
    ``tiny_image_size``, then ``tiny_pretrain_env_config``), not the run's env config: the
    captions, and so the model, stay the same when the run changes how its envs render."""
    from vagent.envs.registry import env_class  # lazy: the registry loads PIL

    out = []
    for name in dict.fromkeys(e.name for e in envs):
        declared = field_types(env_class(name).Config)
        config = {k: v for k, v in {**PRETRAIN_ENV_DEFAULTS, "image_size": m.tiny_image_size}.items() if k in declared}
        out.append(EnvEntry(name=name, config={**config, **m.tiny_pretrain_env_config}))
    return out


def validate_envs(cfg: RunConfig) -> RunConfig:
    """Check every ``envs.N`` entry against its env's declared Config (names, keys, types, limits),
    so that a typo fails here, before a model is built; raise ConfigError naming the entry. An
    entry served by ``vagent serve-env`` (``urls``) whose env is not registered in this process is
    left to its server to check."""
    from vagent.envs.registry import list_envs, make_config  # lazy: the registry loads PIL

    for i, e in enumerate(cfg.envs):
        if e.urls and e.name not in list_envs():
            continue
        try:
            make_config(e.name, **e.config)
        except KeyError as exc:  # unknown env name: the message lists the registered ones
            raise ConfigError(f"envs.{i}.name: {str(exc).strip(chr(34) + chr(39))}") from exc
        except (ConfigError, ValueError, TypeError) as exc:
            raise ConfigError(f"envs.{i}.config: {exc}") from exc
    m = cfg.model
    if m.path == "tiny" and m.tiny_pretrain_steps > 0:  # the caption boards' envs, before the build
        for e in pretrain_env_entries(m, [e for e in cfg.envs if not e.urls or e.name in list_envs()]):
            try:
                make_config(e.name, **e.config)
            except (ConfigError, ValueError, TypeError) as exc:
                raise ConfigError(f"model.tiny_pretrain_env_config ({e.name} caption boards): {exc}") from exc
    return cfg
