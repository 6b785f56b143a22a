"""What a rollout of a run plays, read from the run config: the envs of an RL step
(``train_env_specs``) and of validation (``val_env_specs``), the sampling settings
(``sampling_for``, with ``stop_strings``), and the factories of remote envs (``env_factory_for``).

Seeds are derived, never drawn: step ``k``'s env seeds and sampling seed come from the run seed and
``k`` (:func:`vagent.seeds.derive_seed`), so a resumed run replays the same envs with the same
seeds. ``vagent.recipes.common`` re-exports the four spec functions under their old names.

``env_factory_for(entry)``: envs of a config entry with ``urls`` live on ``vagent serve-env``
servers (``RemoteEnv``: failover over the urls, replay on server loss); one connection pool per
entry, kept until ``close_env_factories()`` (the RL loop's end, ``vagent.recipes.step.StepLoop``).

The run config, the env registry and the service client are imported where they are used, so
``import vagent.rollout.driver`` (which re-exports the factory functions) stays light.
"""

from __future__ import annotations

import json
import threading
from typing import TYPE_CHECKING, Callable

from vagent.rollout.policy import SamplingConfig
from vagent.rollout.trajectory import EnvSpec
from vagent.seeds import SPLITS, derive_seed, split_seeds

if TYPE_CHECKING:
    from vagent.envs.base import Env
    from vagent.runconfig import EnvEntry, RunConfig


# --- remote envs' factories ------------------------------------------------------------------------

#: (urls, name, config, token) -> its RemoteEnv factory, whose ``transport`` holds the connection pool
_FACTORIES: dict[tuple, Callable[[], Env]] = {}
_FACTORIES_LOCK = threading.Lock()


def env_factory_for(entry: EnvEntry) -> Callable[[], Env] | None:
    """A zero-argument factory of ``RemoteEnv`` on ``entry.urls`` with ``entry.token`` (None for an
    in-process entry).

    Cached per (urls, name, config, token): one connection pool per config entry for the run.
    """
    urls = list(getattr(entry, "urls", None) or [])
    if not urls:
        return None
    token = getattr(entry, "token", None)  # None: $VAGENT_SERVICE_TOKEN (vagent.service.client.service_token)
    deadlines = (float(getattr(entry, "timeout_s", 60.0)), float(getattr(entry, "retry_timeout_s", 60.0)))
    key = (tuple(urls), entry.name, json.dumps(entry.config, sort_keys=True, default=str), token, deadlines)
    with _FACTORIES_LOCK:
        if key not in _FACTORIES:
            from vagent.service.batch import remote_env_factory

            _FACTORIES[key] = remote_env_factory(urls, entry.name, token, deadlines[0], retry_timeout=deadlines[1],
                                                 **dict(entry.config))
        return _FACTORIES[key]


def close_env_factories() -> int:
    """Close the connection pool of every cached remote env factory and forget the factories
    (a later ``env_factory_for`` opens a new pool); returns how many were closed."""
    with _FACTORIES_LOCK:
        factories = list(_FACTORIES.values())
        _FACTORIES.clear()
    for make in factories:
        transport = getattr(make, "transport", None)
        if transport is not None:
            transport.close()
    return len(factories)


# --- the envs and sampling of a step ---------------------------------------------------------------


def train_env_specs(cfg: RunConfig, updates_done: int) -> list:
    """The envs of RL step ``updates_done + 1``: for each entry, ``n_train`` consecutive seeds of the
    ``train`` split at an offset derived from (run seed, entry index, updates_done), so a resumed run
    replays the same envs and steps never share a seed by construction within 1e6 / n_train steps.
    An entry with a ``latency`` makes its envs through ``with_latency`` (each step takes a drawn time)."""
    from vagent.envs.latency import with_latency
    from vagent.envs.registry import env_factory
    from vagent.runconfig.validate import env_latency

    specs = []
    size = len(SPLITS["train"])
    for i, e in enumerate(cfg.envs):
        start = (derive_seed(cfg.seed, i) % size + updates_done * e.n_train) % (size - e.n_train)
        factory = env_factory_for(e)  # None for in-process envs; RemoteEnv on e.urls otherwise
        latency = env_latency(e, i)
        if latency is not None:
            factory = with_latency(factory or env_factory(e.name, **e.config), latency)
        specs += [EnvSpec(e.name, dict(e.config), s, factory) for s in split_seeds("train", e.n_train, start)]
    return specs


def val_env_specs(entry: EnvEntry) -> list:
    """The first ``n_val`` seeds of the ``val`` split (the same for every validation); without the
    entry's ``latency`` (validation scores the policy, not the rollout's speed)."""
    return [EnvSpec(entry.name, dict(entry.config), s, env_factory_for(entry)) for s in split_seeds("val", entry.n_val)]


def stop_strings(cfg: RunConfig) -> tuple[str, ...]:
    """``rollout.stop`` plus the strings the run's envs declare as ending a reply
    (an env class's optional ``reply_stop``, e.g. vigorl_zoom's ``"</tool_call>"``), in order.
    A remote entry's (``urls``) come from its server: the env class may live only there."""
    from vagent.envs.registry import env_class
    from vagent.service.preflight import remote_env_info

    out = list(cfg.rollout.stop)
    for e in cfg.envs:
        declared = remote_env_info(e).reply_stop if e.urls else getattr(env_class(e.name), "reply_stop", ())
        out += [s for s in declared if s not in out]
    return tuple(out)


def sampling_for(cfg: RunConfig, updates_done: int, greedy: bool = False) -> SamplingConfig:
    """The rollout's SamplingConfig of RL step ``updates_done + 1`` (seed derived from the run seed and
    ``updates_done``; validation passes 0)."""
    rollout_cfg = cfg.rollout
    return SamplingConfig(
        temperature=0.0 if greedy else rollout_cfg.temperature, top_p=rollout_cfg.top_p, top_k=rollout_cfg.top_k,
        max_new_tokens=rollout_cfg.max_new_tokens, stop=stop_strings(cfg),
        seed=derive_seed(cfg.seed, "sample", updates_done),
    )


__all__ = ["train_env_specs", "val_env_specs", "stop_strings", "sampling_for", "env_factory_for",
           "close_env_factories"]
