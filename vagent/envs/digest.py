"""Scripted episodes of an env and their digests: what the env checker's determinism checks compare.

:func:`scripted_reply` is a deterministic reply for a turn: the env's solver actions
(``optimal_actions``) when it has one, else a cycle over its ``action_names``, rendered in its
reasoning format with :func:`vagent.envs.formats.render_response`. :func:`episode_digest` plays a
seeded episode of such replies and hashes everything it shows (observation texts and pixels, infos,
states, the system prompt, rewards and end flags), so two runs of one seed compare as two strings:
on one instance, on two, and in a fresh Python process (:func:`vagent.envs.checker.check_env`).
Every name here is importable from :mod:`vagent.envs.checker` too.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from vagent.envs.base import Observation
from vagent.envs.formats import FORMATS, render_response


def config_value(env: Any, name: str, default: Any) -> Any:
    """``env.config.<name>``, or ``default`` when the env has no config or no such field."""
    return getattr(getattr(env, "config", None), name, default)


def scripted_reply(env: Any, turn: int) -> str:
    """A deterministic reply for ``turn``: solver actions, else cycling ``action_names``."""
    fmt = config_value(env, "format", "grounding_worldmodeling")
    fmt = fmt if fmt in FORMATS else "grounding_worldmodeling"
    max_actions = int(config_value(env, "max_actions_per_turn", 1))
    actions: list[str] = []
    if callable(getattr(env, "optimal_actions", None)):
        actions = list(env.optimal_actions())[:max_actions]
    names = list(getattr(env, "action_names", ()) or ())
    if not actions and names:
        actions = [names[(turn * 3 + i) % len(names)] for i in range(min(max_actions, 2))]
    if not actions:
        return "<answer></answer>"
    answer = getattr(env, "action_sep", ",").join(actions)
    text = "the checker describes the state"
    return render_response(fmt, {"think": text, "observation": text, "reasoning": text, "prediction": text,
                                 "answer": answer})


def _obs_digest(h: "hashlib._Hash", obs: Observation) -> None:
    h.update(obs.text.encode("utf-8", errors="surrogatepass"))
    for im in obs.images:
        h.update(f"{im.mode}{im.size}".encode())
        h.update(im.tobytes())


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=repr)


def episode_digest(env: Any, seed: int, n_steps: int) -> str:
    """sha256 of one scripted episode: observations (text and pixels), states, rewards, flags, infos."""
    h = hashlib.sha256()
    obs, info = env.reset(seed)
    _obs_digest(h, obs)
    h.update(_json(info).encode())
    h.update(_json(env.state()).encode())
    h.update(env.system_prompt().encode())
    for turn in range(n_steps):
        res = env.step(scripted_reply(env, turn))
        _obs_digest(h, res.obs)
        h.update(repr((float(res.reward), res.terminated, res.truncated)).encode())
        h.update(_json(res.info).encode())
        h.update(_json(env.state()).encode())
        if res.terminated or res.truncated:
            break
    return h.hexdigest()
