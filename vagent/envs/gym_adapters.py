"""Gymnasium adapters, both ways: a vagent env as a ``gymnasium.Env``, and a gymnasium env as a vagent env.

Action format:
    (``FromGymnasium``, registered as ``"gym"``) the reply's ``<answer>`` holds up to
    ``max_actions_per_turn`` names from ``action_names`` (case-insensitive) separated by ``,``;
    name i is the gymnasium ``Discrete`` action i. The first unknown name stops execution and
    marks the turn invalid; a gymnasium termination or truncation stops it too.

Observation:
    ``render="vision"``: text with one ``<image>`` and the env's ``rgb_array`` frame resized
    (box filter, aspect kept) so its longer side is ``image_size``. ``render="text"``: the env's
    ``ansi`` frame with ANSI colour codes removed; a highlighted cell (FrozenLake's player) is
    shown in ``[brackets]``. A feedback line comes first after turn 0; the format reminder last.

Rewards:
    ``reward_scale`` x the sum of the gymnasium rewards of the executed actions, plus ``format``
    (lite 0.1, paper 0.5; ``reward_format`` overrides). ``success``: the episode terminated on a
    step whose gymnasium reward is >= ``success_reward``.

Episode end:
    terminated when the gymnasium env terminates; truncated when it truncates or after
    ``max_steps`` turns (``step`` calls).

Arguments:
    see :class:`GymConfig`: ``env_id``, ``action_names``, ``env_kwargs``, ``description``,
    ``success_reward``, ``reward_scale``, ``max_steps``, ``image_size``, ``reward_format``.

Version:
    v1. ``state()`` holds the gymnasium observation (JSON-able) and no object relations, so
    ``judge_spec`` is None: the reasoning judges have nothing to score. Rendering needs pygame
    for gymnasium's toy-text envs (``pip install pygame``).
"""

from __future__ import annotations

import difflib
import os
import re
import string
import warnings
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
from PIL import Image

from vagent.config import ConfigError, from_mapping
from vagent.envs.base import EnvError, Observation, StepResult
from vagent.envs.formats import format_instruction, format_reward, FormatExample
from vagent.envs.grid import (
    EpisodeClock, check_common_config, feedback_line, observation, parse_actions, reminder_for, resolve_rewards,
    step_info,
)
from vagent.envs.limits import Items
from vagent.envs.registry import EnvConfig

import gymnasium
from gymnasium import spaces

# gymnasium's toy-text renderers import pygame lazily; keep it headless, silent and quiet.
for _key, _value in (("SDL_VIDEODRIVER", "dummy"), ("SDL_AUDIODRIVER", "dummy"), ("PYGAME_HIDE_SUPPORT_PROMPT", "1")):
    os.environ.setdefault(_key, _value)


def _import_pygame_quietly() -> None:
    """Import pygame (if installed) without its pkg_resources deprecation warning."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="pkg_resources is deprecated", category=UserWarning)
        try:
            import pygame  # noqa: F401
        except ImportError:
            pass

REWARD_PRESETS = {"lite": {"format": 0.1}, "paper": {"format": 0.5}}
_ANSI_HIGHLIGHT = re.compile(r"\x1b\[(?:4\d|7)(?:;\d+)*m(.*?)\x1b\[0m", re.S)
_ANSI_ANY = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def strip_ansi(text: str) -> str:
    """Remove ANSI escape codes; text with a background highlight is kept as ``[text]``."""
    return _ANSI_ANY.sub("", _ANSI_HIGHLIGHT.sub(r"[\1]", text)).strip("\n")


def to_jsonable(value: Any) -> Any:
    """A gymnasium observation as JSON-able data (numpy scalars and arrays become Python values)."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    return value


# ---------------------------------------------------------------------------------------------
# gymnasium -> vagent
# ---------------------------------------------------------------------------------------------

@dataclass
class GymConfig(EnvConfig):
    """Options of a wrapped gymnasium env (the shared EnvConfig fields come first)."""

    #: the gymnasium id to make (its action space must be Discrete)
    env_id: str = "FrozenLake-v1"
    #: one name per discrete action, in action-index order (FrozenLake: Left, Down, Right, Up)
    action_names: tuple[str, ...] = ("Left", "Down", "Right", "Up")
    #: keyword arguments for gymnasium.make
    env_kwargs: dict = field(default_factory=lambda: {"is_slippery": False})
    #: a sentence about the task for the system prompt (empty: a generic sentence naming env_id)
    description: str = "Walk across the frozen lake from the start S to the goal G without falling into a hole H."
    #: success = the episode terminated on a step whose gymnasium reward is >= this
    success_reward: float = 1.0
    #: factor applied to the gymnasium rewards
    reward_scale: float = 1.0
    #: turns (step calls) before the episode is truncated
    max_steps: int = 20
    #: longer side of the rendered image in pixels (render="vision")
    image_size: int = 96
    #: format bonus per turn (correct format and >= 1 valid action); None = preset (lite 0.1, paper 0.5)
    reward_format: float | None = None
    #: accept gymnasium's "module:EnvName-v0" ids, which import ``module`` first (False: only ids
    #: already in gymnasium's registry; on an env server only the operator may set it)
    allow_module_ids: bool = False


def check_env_id(env_id: str, allow_module_ids: bool) -> None:
    """Raise ConfigError unless ``env_id`` is in gymnasium's registry (or, with
    ``allow_module_ids``, a ``module:Name`` id): no unregistered string reaches ``importlib``."""
    if env_id in gymnasium.registry:
        return
    if ":" in env_id:
        if allow_module_ids:
            return
        raise ConfigError(f"gym.env_id: {env_id!r} names a module to import (gymnasium's 'module:Name' form), "
                          "which is off by default; register the env with gymnasium in your own code, or set "
                          "allow_module_ids=True (on an env server: the operator, `vagent serve-env --env-config "
                          "gym.allow_module_ids=true`).")
    close = difflib.get_close_matches(env_id, list(gymnasium.registry), n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise ConfigError(f"gym.env_id: {env_id[:100]!r} is not a registered gymnasium id.{hint} See "
                      "`gymnasium.pprint_registry()` for the registered ids.")


class FromGymnasium:
    """A discrete-action gymnasium env as a vagent env (named actions, reasoning formats).

    ``FromGymnasium(GymConfig(...))`` (the registry's way, ``make("gym", env_id=..., ...)``), or
    ``FromGymnasium("CliffWalking-v1", ["Up", "Right", "Down", "Left"], render="text")``, or
    ``FromGymnasium(gym_env, names)`` with an env made with ``render_mode="rgb_array"``
    (``"ansi"`` for ``render="text"``).
    """

    Config = GymConfig
    judge_spec = None
    action_sep = ","
    #: upper bounds checked by make() and the env server (vagent/envs/limits.py; docs/envs.md)
    config_bounds = {"image_size": (8, 1024), "action_names": Items(64, 64)}
    #: reward_scale multiplies rewards: |value| <= limits.REWARD_LIMIT like the reward_* fields
    reward_fields = ("reward_scale",)
    #: only the operator of an env server sets these (arbitrary constructor arguments; module imports)
    server_only = ("env_kwargs", "allow_module_ids")

    def __init__(self, env: GymConfig | gymnasium.Env | str | None = None, action_names: Sequence[str] | None = None,
                 **config: Any) -> None:
        gym_env = None
        if isinstance(env, GymConfig):
            if action_names is not None or config:
                raise TypeError("FromGymnasium(GymConfig) takes no further arguments; put them in the config.")
            cfg = env
        else:
            values = dict(config)
            if isinstance(env, str):
                values["env_id"] = env
            elif isinstance(env, gymnasium.Env):
                gym_env = env
                values.setdefault("env_id", env.spec.id if env.spec is not None else type(env.unwrapped).__name__)
                values.setdefault("description", "")
                values.setdefault("env_kwargs", {})
            if action_names is not None:
                values["action_names"] = list(action_names)
            cfg = from_mapping(GymConfig, values, where="gym config")
        check_common_config(cfg, "gym")
        self.config = cfg
        self.rewards = resolve_rewards(cfg, REWARD_PRESETS, "gym")
        want = "rgb_array" if cfg.render == "vision" else "ansi"
        _import_pygame_quietly()
        if gym_env is None:
            check_env_id(cfg.env_id, cfg.allow_module_ids)
            try:
                gym_env = gymnasium.make(cfg.env_id, render_mode=want, **cfg.env_kwargs)
            except (gymnasium.error.Error, TypeError, ValueError, ImportError, AssertionError) as exc:
                raise ConfigError(f"gym.env_id: gymnasium.make({cfg.env_id!r}, render_mode={want!r}, **env_kwargs) "
                                  f"failed: {type(exc).__name__}: {str(exc)[:300]}") from exc
        elif gym_env.render_mode != want:
            raise ConfigError(f"gym: render={cfg.render!r} needs a gymnasium env made with render_mode={want!r}, "
                              f"got {gym_env.render_mode!r}; make it with gymnasium.make(..., render_mode={want!r}).")
        if not isinstance(gym_env.action_space, spaces.Discrete):
            raise ConfigError(f"gym: {cfg.env_id} has action space {gym_env.action_space}; only Discrete is supported.")
        if len(cfg.action_names) != int(gym_env.action_space.n):
            raise ConfigError(f"gym.action_names: {cfg.env_id} has {int(gym_env.action_space.n)} actions, got "
                              f"{len(cfg.action_names)} names {list(cfg.action_names)}; give one name per action index.")
        if len({a.lower() for a in cfg.action_names}) != len(cfg.action_names):
            raise ConfigError(f"gym.action_names: names must differ (case-insensitively): {list(cfg.action_names)}.")
        self.action_names = tuple(cfg.action_names)
        self._env = gym_env
        self._clock = EpisodeClock(f"gym:{cfg.env_id}", cfg.max_steps)
        self._reminder = reminder_for(cfg)
        self._obs: Any = None

    def reset(self, seed: int) -> tuple[Observation, dict]:
        self._obs, _ = self._env.reset(seed=int(seed))
        self._clock.reset()
        return self._observation(""), {"success": False}

    def step(self, response: str) -> StepResult:
        self._clock.tick()
        cfg = self.config
        pa = parse_actions(response, cfg.format, self.action_names, cfg.max_actions_per_turn, ",")
        executed, env_reward, terminated, gym_truncated, success, changed = [], 0.0, False, False, False, False
        for action in pa.actions:
            before = self._obs
            self._obs, r, terminated, gym_truncated, _ = self._env.step(self.action_names.index(action))
            executed.append(action)
            env_reward += float(r)
            changed = changed or not np.array_equal(np.asarray(before), np.asarray(self._obs))
            if terminated or gym_truncated:
                success = bool(terminated and float(r) >= cfg.success_reward)
                break
        reward = cfg.reward_scale * env_reward + format_reward(pa.parsed, len(executed), self.rewards["format"])
        terminated = bool(terminated)
        truncated = self._clock.finish(terminated, bool(gym_truncated))
        effect = f"Environment reward {env_reward:g}." + (" The episode is over." if terminated or truncated else "")
        info = step_info(pa, executed, changed, success, env_reward=env_reward)
        return StepResult(self._observation(feedback_line(pa, executed, effect)), float(reward), terminated, truncated, info)

    def system_prompt(self) -> str:
        cfg = self.config
        lines = [
            cfg.description or f"You are playing the gymnasium environment {cfg.env_id}.",
            f"Actions: {', '.join(self.action_names)}.",
            f"The episode ends when the environment says so, or after {cfg.max_steps} turns.",
        ]
        if cfg.render == "text":
            lines.append("Each observation is the environment's text rendering; a highlighted cell is shown in [brackets].")
        else:
            lines.append("Each observation is an image of the environment.")
        example = FormatExample(
            observation="A description of what I see.", reasoning="Why the next actions bring me closer to the goal.",
            prediction="A description of what I expect to see next.",
            answer=",".join(self.action_names[: min(2, cfg.max_actions_per_turn)]),
        )
        lines.append(format_instruction(cfg.format, example, cfg.description_style, ",", cfg.max_actions_per_turn))
        return "\n".join(lines)

    def state(self) -> dict:
        self._clock.require_started()
        return {"env_id": self.config.env_id, "observation": to_jsonable(self._obs), "relations": []}

    def close(self) -> None:
        self._env.close()
        self._clock.close()

    def _observation(self, feedback: str) -> Observation:
        frame = self._env.render()
        if self.config.render == "text":
            return observation("text", strip_ansi(str(frame)).splitlines(), lambda: None, feedback, self._reminder)
        return observation("vision", [], lambda: self._image(frame), feedback, self._reminder)

    def _image(self, frame: Any) -> Image.Image:
        image = Image.fromarray(np.asarray(frame, dtype=np.uint8)).convert("RGB")
        scale = self.config.image_size / max(image.size)
        size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
        return image.resize(size, Image.Resampling.BOX)


# ---------------------------------------------------------------------------------------------
# vagent -> gymnasium
# ---------------------------------------------------------------------------------------------

#: characters an observation text may hold by default (printable ASCII, tab and newline)
DEFAULT_CHARSET = string.printable


class GymnasiumEnv(gymnasium.Env):
    """A vagent env as a ``gymnasium.Env``: actions are reply strings, observations
    ``{"text": str, "image": uint8 array of image_shape}``.

    The image is the observation's first image resized to ``image_shape`` (zeros when there is
    none, e.g. ``render="text"``). Characters outside ``charset`` in observation texts are
    replaced by ``replacement`` (model replies can echo anything into the feedback line); a
    text longer than ``max_text_len`` raises EnvError. ``reset(seed=None)`` draws the vagent
    seed from the gymnasium ``np_random`` so unseeded resets continue a seeded stream.
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 4}

    def __init__(self, vagent_env: Any, max_text_len: int = 8192, image_shape: tuple[int, int, int] = (96, 96, 3),
                 charset: str = DEFAULT_CHARSET, replacement: str = "?", render_mode: str | None = None) -> None:
        if replacement not in charset:
            raise ValueError(f"replacement {replacement!r} must be in charset")
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"render_mode must be None or 'rgb_array', got {render_mode!r}")
        self.vagent_env = vagent_env
        self.max_text_len, self.image_shape = max_text_len, tuple(image_shape)
        self._charset, self._replacement = frozenset(charset), replacement
        self.render_mode = render_mode
        self.action_space = spaces.Text(max_length=max_text_len, min_length=0, charset=charset)
        self.observation_space = spaces.Dict({
            "text": spaces.Text(max_length=max_text_len, min_length=0, charset=charset),
            "image": spaces.Box(0, 255, shape=self.image_shape, dtype=np.uint8),
        })
        self._last_image = np.zeros(self.image_shape, dtype=np.uint8)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        super().reset(seed=seed)
        vseed = int(seed) if seed is not None else int(self.np_random.integers(0, 2**31 - 1))
        obs, info = self.vagent_env.reset(vseed)
        return self._convert(obs), dict(info)

    def step(self, action: str) -> tuple[dict, float, bool, bool, dict]:
        res = self.vagent_env.step(action)
        return self._convert(res.obs), float(res.reward), bool(res.terminated), bool(res.truncated), dict(res.info)

    def render(self) -> np.ndarray | None:
        return self._last_image.copy() if self.render_mode == "rgb_array" else None

    def close(self) -> None:
        self.vagent_env.close()

    def _convert(self, obs: Observation) -> dict:
        text = "".join(ch if ch in self._charset else self._replacement for ch in obs.text)
        if len(text) > self.max_text_len:
            raise EnvError(f"observation text has {len(text)} characters, more than max_text_len={self.max_text_len}; "
                           "pass a larger max_text_len to GymnasiumEnv.")
        image = np.zeros(self.image_shape, dtype=np.uint8)
        if obs.images:
            h, w, c = self.image_shape
            im = obs.images[0].convert("RGB" if c == 3 else "L").resize((w, h), Image.Resampling.BOX)
            image = np.asarray(im, dtype=np.uint8).reshape(self.image_shape).copy()
        self._last_image = image
        return {"text": text, "image": image}


__all__ = ["FromGymnasium", "GymConfig", "GymnasiumEnv", "strip_ansi", "to_jsonable"]
