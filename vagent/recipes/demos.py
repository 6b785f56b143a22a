"""Solver demonstrations for SFT warm starts, written in the SFT chat-data format.

``vagent demos frozenlake --format grounding_worldmodeling --n 64 demos.jsonl`` plays ``n``
episodes with the env's solver (``env.optimal_actions()``) on seeds of a split and writes one
chat per episode (docs/training.md, "SFT data")::

    {"messages": [{"role": "system", "content": <env.system_prompt()>},
                  {"role": "user", "content": <observation text with <image>>},
                  {"role": "assistant", "content": <reply>}, ...],
     "images": ["demos_images/s0000123_t0_0.png", ...],      # relative to the JSONL file
     "meta": {"env_name", "env_config", "seed", "success", "turns": [{"actions", "random"}]}}

The system prompt and observations are the env's own, exactly as the RL rollout shows them
(docs/algorithms.md reference bug 9): they come from the same ``make(name, **config)``, ``reset(seed)`` and
``step(reply)`` calls. Each reply is written with ``formats.render_response`` and its reasoning
fields come from the TRUE state:

- ``<observation>``: the env module's ``describe_state(state_before, style)``;
- ``<prediction>``: ``describe_state(state_after, style)``, where ``state_after`` is what the
  chosen actions do, found first without changing the env (``vagent.rollout.scripted.state_after``:
  the env's ``predict_state`` where it has one, as primitive_skill on ManiSkill, else a stepped
  deep copy), so it is exactly what happens;
- ``<reasoning>``: a short plan naming the actions (``"I move Down, Right."``), preceded, when
  ``reasoning_objects`` is set, by the natural-language relation of those objects to the agent in
  the true state (``"The goal is below and to the right of you."``): a step of reasoning a model
  can learn from its own ``<observation>`` text; ``reasoning_plan=False`` drops the plan
  sentence, so the choice of actions is made in ``<answer>`` only;
- ``<answer>``: the next ``actions_per_turn`` solver actions, each replaced with probability
  ``random_action_frac`` by a random action (RNG seeded by the episode seed), so the SFT data
  has mistakes and recoveries and a model warm-started on it does not saturate.

``objects`` restricts the descriptions to some object types (e.g. ``("goal",)``) to keep replies
short; descriptions are still correct, just partial. An episode ends when the env ends it, when
the solver has no action (e.g. fell into a hole) or after ``max_turns`` turns.
"""

from __future__ import annotations

import importlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from vagent.envs import env_class, make
from vagent.envs.formats import render_response
from vagent.seeds import split_seeds


@dataclass(frozen=True)
class DemoSettings:
    """How demonstrations are played and written."""

    #: registered env name
    env: str
    #: env config (format, render, ...) passed to vagent.envs.make
    env_config: dict = field(default_factory=dict)
    #: episodes to write
    n: int = 64
    #: seed split the episodes are drawn from
    split: str = "train"
    #: offset of the first seed within the split
    offset: int = 0
    #: probability that each action is replaced by a uniformly random one (must be 0 for an env
    #: without ``action_names``, whose actions are free-form, e.g. svg; ``default_random_frac``)
    random_action_frac: float = 0.1
    #: actions per reply (null = the env's max_actions_per_turn)
    actions_per_turn: int | None = None
    #: turn limit
    max_turns: int = 10
    #: describe only these object types (empty = all the env describes)
    objects: tuple[str, ...] = ()
    #: start <reasoning> with the natural-language relation of these object types to the agent
    #: (e.g. ("goal",): "The goal is below and to the right of you. I move Down, Right.")
    reasoning_objects: tuple[str, ...] = ()
    #: end <reasoning> with the plan "I move Down, Right." (False: the relation sentence only, or
    #: "I move." when there is none, so the <answer> is where the choice is made)
    reasoning_plan: bool = True


def default_random_frac(env_name: str, frac: float = 0.1) -> float:
    """``frac`` for an env with an action list, 0 for one whose actions are free-form (svg,
    vigorl_*: no ``action_names``, so there is no random action to draw)."""
    return frac if getattr(env_class(env_name), "action_names", ()) else 0.0


def _describe_fn(env: Any) -> Callable[[dict, str], str]:
    module = importlib.import_module(type(env).__module__)
    fn = getattr(module, "describe_state", None)
    if fn is None:
        raise TypeError(
            f"{type(env).__name__}'s module {module.__name__} has no describe_state(state, style); "
            "demonstrations need it to fill the reasoning fields from the true state."
        )
    return fn


def _filtered(state: dict, objects: Sequence[str]) -> dict:
    if not objects or "relations" not in state:
        return state
    out = dict(state)
    out["relations"] = [r for r in state["relations"] if r.get("object") in objects]
    return out


def _choose_actions(env: Any, k: int, frac: float, rng: np.random.Generator) -> tuple[list[str], list[bool]]:
    plan = list(env.optimal_actions())[:k]
    names = list(getattr(env, "action_names", ()))
    if not names:  # a free-form action (svg: SVG source; vigorl: a tool call): nothing to draw from
        if frac > 0:
            raise ValueError(
                f"{type(env).__name__} has no action_names (its actions are free-form), so solver actions "
                f"cannot be replaced by random ones: set random_action_frac 0 (--random-action-frac 0), "
                f"got {frac}."
            )
        return plan, [False] * len(plan)
    actions, random_flags = [], []
    draw = getattr(env, "random_action", None)  # an env whose actions take arguments (primitive_skill)
    for a in plan:
        if frac > 0 and rng.random() < frac:
            actions.append(draw(rng) if callable(draw) else names[int(rng.integers(len(names)))])
            random_flags.append(True)
        else:
            actions.append(a)
            random_flags.append(False)
    return actions, random_flags


def demo_reply(env: Any, actions: Sequence[str], objects: Sequence[str] = (),
               reasoning_objects: Sequence[str] = (), plan: bool = True) -> str:
    """The reply for ``actions`` from the env's current state, reasoning fields from the truth.

    The state after the actions is :func:`vagent.rollout.scripted.state_after`'s (the env
    itself is untouched).
    """
    from vagent.rollout.scripted import state_after

    cfg = env.config
    describe = _describe_fn(env)
    style = cfg.description_style
    sep = getattr(env, "action_sep", ",")
    answer = sep.join(actions)
    before = env.state()
    draft = render_response(cfg.format, {"think": "plan", "observation": "state", "reasoning": "plan",
                                         "prediction": "state", "answer": answer})
    after = state_after(env, draft)
    relation = describe(_filtered(before, reasoning_objects), "natural") if reasoning_objects else ""
    plan_text = f"I move {', '.join(actions)}." if plan else ("" if relation else "I move.")
    fields = {
        "observation": describe(_filtered(before, objects), style),
        "prediction": describe(_filtered(after, objects), style),
        "reasoning": " ".join(x for x in (relation, plan_text) if x),
        "answer": answer,
    }
    fields["think"] = fields["reasoning"]
    return render_response(cfg.format, fields)


def play_demo(settings: DemoSettings, seed: int, image_dir: Path | None, image_prefix: str = "") -> dict:
    """One solver episode as a chat record (see the module docstring)."""
    env = make(settings.env, **settings.env_config)
    if not hasattr(env, "optimal_actions"):
        raise TypeError(f"env {settings.env!r} has no solver (optimal_actions); it cannot make demonstrations.")
    rng = np.random.default_rng([int(seed), 7_919])  # the episode's own stream: same demo in any process
    k = settings.actions_per_turn or int(getattr(env.config, "max_actions_per_turn", 1))
    obs, _ = env.reset(seed)
    messages = [{"role": "system", "content": env.system_prompt()}]
    images: list[str] = []
    turns_meta = []
    success = False
    try:
        for t in range(settings.max_turns):
            actions, flags = _choose_actions(env, k, settings.random_action_frac, rng)
            if not actions:
                break
            messages.append({"role": "user", "content": obs.text})
            for j, im in enumerate(obs.images):
                name = f"s{seed:07d}_t{t}_{j}.png"
                if image_dir is not None:
                    image_dir.mkdir(exist_ok=True)  # on the first image: a text env leaves no empty folder
                    im.save(image_dir / name)
                images.append(f"{image_prefix}{name}")
            reply = demo_reply(env, actions, settings.objects, settings.reasoning_objects, settings.reasoning_plan)
            messages.append({"role": "assistant", "content": reply})
            result = env.step(reply)
            turns_meta.append({"actions": actions, "random": flags, "reward": result.reward})
            success = bool(result.info.get("success", False))
            obs = result.obs
            if result.terminated or result.truncated:
                break
    finally:
        env.close()
    meta = {"env_name": settings.env, "env_config": dict(settings.env_config), "seed": int(seed),
            "success": success, "turns": turns_meta}
    return {"messages": messages, "images": images, "meta": meta}


def write_demos(settings: DemoSettings, out: str | Path) -> dict:
    """Write ``settings.n`` demonstrations to the JSONL file ``out``; returns summary numbers. The
    file appears once every demonstration is written: a failed run (an env that cannot be made)
    leaves no file, and an older one of that name as it was."""
    out = Path(out)
    if settings.n < 1:
        raise ValueError(f"n must be >= 1, got {settings.n}")
    if not 0 <= settings.random_action_frac <= 1:
        raise ValueError(f"random_action_frac must be in [0, 1], got {settings.random_action_frac}")
    out.parent.mkdir(parents=True, exist_ok=True)
    image_dir = out.parent / f"{out.stem}_images"  # made by the first image (none for a text env)
    seeds = split_seeds(settings.split, settings.n, settings.offset)
    n_success = n_turns = 0
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w") as f:
            for seed in seeds:
                rec = play_demo(settings, seed, image_dir, f"{image_dir.name}/")
                f.write(json.dumps(rec) + "\n")
                n_success += rec["meta"]["success"]
                n_turns += len(rec["meta"]["turns"])
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return {"episodes": len(seeds), "success_rate": n_success / len(seeds), "turns": n_turns, "path": str(out)}
