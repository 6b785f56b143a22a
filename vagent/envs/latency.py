"""Long-tailed env step latency: a wrapper that makes each ``step`` take a drawn time, for benchmarks.

Agent envs are slow in a long-tailed way (a simulator that sometimes re-plans, an env server
behind a busy network, a tool call that times out), and that tail is what keeps a lockstep
rollout waiting for its slowest trajectory. :class:`LatencyEnv` reproduces it on a fast env:
after the wrapped env's ``step`` returns, it sleeps a latency drawn from a heavy-tailed
distribution, then returns the same :class:`~vagent.envs.base.StepResult`. Observations, rewards,
flags, infos and states are the wrapped env's, untouched; only the wall time changes. ``reset``
is not delayed.

Distributions (:class:`StepLatency`; both parameterised by their median ``median_s``):

- ``"lognormal"``: ``median_s * exp(sigma * Z)``, ``Z ~ N(0, 1)``. Quantile q:
  ``median_s * exp(sigma * Phi^-1(q))``, so p99 / median = ``exp(2.326 sigma)``: 10.2x for the
  default ``sigma = 1``; the mean is ``median_s * exp(sigma^2 / 2)`` (1.65x the median).
- ``"pareto"`` (type I, tail index ``alpha``): ``x_m * U^(-1/alpha)`` with
  ``x_m = median_s / 2^(1/alpha)``, ``U ~ Uniform(0, 1]``. Quantile q: ``x_m (1 - q)^(-1/alpha)``,
  so p99 / median = ``50^(1/alpha)``: 13.6x for the default ``alpha = 1.5``; the mean is finite
  only for ``alpha > 1`` (``alpha x_m / (alpha - 1)``: 1.9x the median at 1.5).

Every draw is cut at ``max_s`` so one step cannot hang a run. Reproducible: the draws of an
episode come from a ``random.Random`` seeded at ``reset(seed)`` with a sha256 of ``(salt, seed)``
(never Python's ``hash()``), so the same env seed gives the same latencies in any process, step
after step, whatever the other envs do; :func:`episode_latencies` lists them without sleeping.

Use: ``LatencyEnv(make("frozenlake"), StepLatency(median_s=0.05))``, or around a factory with
:func:`with_latency`; a config section maps onto :class:`StepLatency` with
``vagent.config.from_mapping(StepLatency, {"dist": "pareto", "median_s": 0.05, "alpha": 1.5})``.
"""

from __future__ import annotations

import hashlib
import math
import random
import time
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any, Callable

from vagent.config import ConfigError
from vagent.envs.base import Env, Observation, StepResult

__all__ = ["LATENCY_DISTS", "LatencyEnv", "StepLatency", "episode_latencies", "latency_rng", "with_latency"]

LATENCY_DISTS = ("lognormal", "pareto")


@dataclass(frozen=True)
class StepLatency:
    """How long each env step takes (the module docstring gives the formulas)."""

    #: the distribution of one step's latency: "lognormal" or "pareto"
    dist: str = "lognormal"
    #: the median latency of one step, in seconds
    median_s: float = 0.05
    #: lognormal only: the standard deviation of log(latency); p99 / median = exp(2.326 sigma)
    sigma: float = 1.0
    #: pareto only: the tail index (> 0; mean finite above 1); p99 / median = 50^(1/alpha)
    alpha: float = 1.5
    #: the longest a step may take, in seconds: every draw is cut there
    max_s: float = 10.0
    #: a salt mixed with the env seed: wrappers with different salts draw independent latencies
    salt: int = 0

    def __post_init__(self) -> None:
        if self.dist not in LATENCY_DISTS:
            raise ConfigError(f"step latency dist must be one of {LATENCY_DISTS}, got {self.dist!r}.")
        for name in ("median_s", "sigma", "alpha", "max_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ConfigError(f"step latency {name} must be a finite number > 0, got {value!r}.")
        if self.max_s < self.median_s:
            raise ConfigError(f"step latency max_s ({self.max_s}) must be at least median_s ({self.median_s}); "
                              "raise max_s or lower median_s.")

    def quantile(self, q: float) -> float:
        """The latency (seconds) below which a fraction ``q`` of the draws fall, ``0 < q < 1``,
        before the cut at ``max_s``."""
        if not 0.0 < q < 1.0:
            raise ValueError(f"q must lie strictly between 0 and 1, got {q}")
        if self.dist == "lognormal":
            return self.median_s * math.exp(self.sigma * NormalDist().inv_cdf(q))
        x_m = self.median_s / 2.0 ** (1.0 / self.alpha)
        return x_m * (1.0 - q) ** (-1.0 / self.alpha)

    def draw(self, rng: random.Random) -> float:
        """One step's latency in seconds, from ``rng``, cut at ``max_s``."""
        if self.dist == "lognormal":
            x = rng.lognormvariate(math.log(self.median_s), self.sigma)  # median_s * exp(sigma Z)
        else:
            x = self.median_s / 2.0 ** (1.0 / self.alpha) * rng.paretovariate(self.alpha)  # x_m U^(-1/alpha)
        return min(x, self.max_s)


def latency_rng(latency: StepLatency, seed: int) -> random.Random:
    """The RNG of the latencies of the episode reset with ``seed`` (process-independent)."""
    digest = hashlib.sha256(f"vagent.envs.latency:{latency.salt}:{int(seed)}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "little"))


def episode_latencies(latency: StepLatency, seed: int, n_steps: int) -> list[float]:
    """The latencies (seconds) of the first ``n_steps`` steps after ``reset(seed)``, without sleeping."""
    rng = latency_rng(latency, seed)
    return [latency.draw(rng) for _ in range(n_steps)]


class LatencyEnv:
    """An :class:`~vagent.envs.base.Env` that is ``env`` with each ``step`` taking a drawn latency.

    Every other attribute (``config``, ``optimal_actions``, ``spec_name``, ...) is the wrapped
    env's. ``last_latency_s`` / ``total_latency_s`` / ``n_delayed`` say what was slept (since
    construction), for diagnostics; nothing of it enters the step's result.
    """

    def __init__(self, env: Env, latency: StepLatency) -> None:
        if not isinstance(latency, StepLatency):
            raise TypeError(f"latency must be a StepLatency, got {type(latency).__name__}")
        self.env = env
        self.latency = latency
        self._rng: random.Random | None = None
        self.last_latency_s = 0.0
        self.total_latency_s = 0.0
        self.n_delayed = 0

    def reset(self, seed: int) -> tuple[Observation, dict]:
        out = self.env.reset(seed)
        self._rng = latency_rng(self.latency, seed)
        return out

    def step(self, response: str) -> StepResult:
        result = self.env.step(response)  # the wrapped env's errors (step before reset, ...) come first
        if self._rng is None:
            raise RuntimeError(f"{type(self.env).__name__}.step succeeded before any reset: LatencyEnv has no "
                               "episode RNG; call reset(seed) on the wrapper, not on the env inside it.")
        delay = self.latency.draw(self._rng)
        time.sleep(delay)
        self.last_latency_s = delay
        self.total_latency_s += delay
        self.n_delayed += 1
        return result

    def system_prompt(self) -> str:
        return self.env.system_prompt()

    def state(self) -> dict:
        return self.env.state()

    def close(self) -> None:
        self.env.close()

    def __getattr__(self, name: str) -> Any:
        if name == "env":  # not set yet (copy/unpickle): do not recurse
            raise AttributeError(name)
        return getattr(self.env, name)

    def __repr__(self) -> str:
        return f"LatencyEnv({self.env!r}, {self.latency})"


def with_latency(factory: Callable[[], Env], latency: StepLatency | None) -> Callable[[], Env]:
    """A factory of ``factory()``'s envs wrapped in :class:`LatencyEnv` (``factory`` itself when
    ``latency`` is None)."""
    if latency is None:
        return factory
    return lambda: LatencyEnv(factory(), latency)
