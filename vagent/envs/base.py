"""The environment contract every vagent environment satisfies.

An environment shows the model an :class:`Observation` (text with ``<image>`` placeholders and
the images, in order), takes the model's whole raw reply in :meth:`Env.step` (the env parses it
with its reasoning format), and returns a :class:`StepResult`. ``state()`` is the ground truth
that the reasoning judges compare the model's descriptions against.

Rules (docs/algorithms.md reference section 11):

- a seed fully determines an episode in any process (no global RNG, no ``hash()``);
- an environment error is an error, never a silent reward;
- ``terminated`` (a terminal state: success, a hole) is separate from ``truncated`` (a limit).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol, runtime_checkable

from PIL import Image

IMAGE_PLACEHOLDER = "<image>"


class EnvError(RuntimeError):
    """Raised when an environment is used wrongly (e.g. step before reset, step after the end)."""


class EpisodeOverError(EnvError):
    """Raised by ``step`` after the episode terminated or was truncated: call ``reset`` first."""


@dataclass(frozen=True)
class Observation:
    """What the model sees: ``text`` holds one ``<image>`` placeholder per image, in order."""

    text: str
    images: tuple[Image.Image, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.text, str):
            raise TypeError(f"Observation.text must be str, got {type(self.text).__name__}")
        if not isinstance(self.images, tuple):
            object.__setattr__(self, "images", tuple(self.images))
        n = self.text.count(IMAGE_PLACEHOLDER)
        if n != len(self.images):
            raise ValueError(
                f"Observation has {n} '{IMAGE_PLACEHOLDER}' placeholder(s) in its text but "
                f"{len(self.images)} image(s); put exactly one placeholder per image, in order."
            )
        for i, im in enumerate(self.images):
            if not isinstance(im, Image.Image):
                raise TypeError(f"Observation.images[{i}] must be a PIL.Image, got {type(im).__name__}")


@dataclass(frozen=True)
class StepResult:
    """The outcome of one ``step``: the next observation, the reward and why the episode ended.

    ``info`` is diagnostics only (metrics such as ``action_is_valid``, ``success``); nothing in
    training reads control flow from it except the documented metric keys.
    """

    obs: Observation
    reward: float
    terminated: bool
    truncated: bool
    info: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Relation:
    """An object's position relative to the agent, the unit the rule judge scores.

    ``vertical`` in {above, below, same} (or env-specific words such as ahead/behind),
    ``horizontal`` in {left, right, same}; ``position`` optional coordinates.
    """

    object: str
    vertical: str
    horizontal: str
    position: tuple[float, ...] | None = None


@dataclass(frozen=True)
class JudgeSpec:
    """What an env declares so the rule judge can score descriptions of its state.

    ``object_weights``: weight of each object type in the score (they sum to 1), e.g. Sokoban
    ``{"box": 0.5, "target": 0.5}``; FrozenLake ``{"goal": 0.7, "hole": 0.3}``.
    ``synonyms``: words a description may use for each object type.
    ``vertical_words`` / ``horizontal_words``: the relation vocabulary.
    """

    object_weights: Mapping[str, float]
    synonyms: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    vertical_words: tuple[str, ...] = ("above", "below", "same")
    horizontal_words: tuple[str, ...] = ("left", "right", "same")


@runtime_checkable
class Env(Protocol):
    """The contract. ``step`` takes the model's raw reply; the env parses it."""

    def reset(self, seed: int) -> tuple[Observation, dict]: ...

    def step(self, response: str) -> StepResult: ...

    def system_prompt(self) -> str: ...

    def state(self) -> dict: ...

    def close(self) -> None: ...


@runtime_checkable
class SolvableEnv(Env, Protocol):
    """An env whose task has a solver: the optimal next actions from the current state."""

    def optimal_actions(self) -> list[str]: ...


def state_key(state: Mapping[str, Any]) -> str:
    """A process-independent key of a state (sha256 of canonical JSON), for step-level grouping.

    Never use Python's ``hash()`` for this: it is salted per process (docs/algorithms.md reference bug 1).
    """
    blob = json.dumps(state, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]
