"""The long-tailed step latency wrapper (``vagent.envs.latency``): its distributions' median and p99
over many draws, seeded reproducibility, and an env whose episodes are unchanged by it."""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import time

import pytest

from vagent.config import ConfigError, from_mapping
from vagent.envs import EnvError, make
from vagent.envs.checker import episode_digest
from vagent.envs.latency import LatencyEnv, StepLatency, episode_latencies, with_latency


def pooled_draws(latency: StepLatency, n_seeds: int, n_steps: int) -> list[float]:
    return [x for seed in range(n_seeds) for x in episode_latencies(latency, seed, n_steps)]


def quantile(xs: list[float], q: float) -> float:
    return statistics.quantiles(xs, n=1000, method="inclusive")[round(q * 1000) - 1]


def test_documented_tail_ratios():
    # lognormal: p99 / median = exp(2.326 sigma); pareto: 50^(1/alpha)
    assert StepLatency(sigma=1.0).quantile(0.99) / 0.05 == pytest.approx(math.exp(2.3263), rel=1e-4)
    assert StepLatency(sigma=1.0).quantile(0.5) == pytest.approx(0.05)
    pareto = StepLatency(dist="pareto", alpha=1.5)
    assert pareto.quantile(0.5) == pytest.approx(0.05)
    assert pareto.quantile(0.99) / 0.05 == pytest.approx(50 ** (1 / 1.5))  # 13.57x


@pytest.mark.parametrize("latency, n_seeds, tol_p99", [
    (StepLatency(dist="lognormal", median_s=0.05, sigma=1.0, max_s=100.0), 200, 0.10),
    (StepLatency(dist="lognormal", median_s=0.2, sigma=0.5, max_s=100.0), 200, 0.10),
    (StepLatency(dist="pareto", median_s=0.05, alpha=1.5, max_s=100.0), 500, 0.12),
    (StepLatency(dist="pareto", median_s=0.01, alpha=3.0, max_s=100.0), 500, 0.12),
])
def test_median_and_p99_over_many_draws(latency, n_seeds, tol_p99):
    # 100 steps per episode over many env seeds (20k / 50k draws): the empirical median and p99
    # lie within a few standard errors of the formulas (about 1% and 3-5% here)
    xs = pooled_draws(latency, n_seeds, 100)
    assert statistics.median(xs) == pytest.approx(latency.median_s, rel=0.05)
    assert quantile(xs, 0.99) == pytest.approx(latency.quantile(0.99), rel=tol_p99)
    assert quantile(xs, 0.99) / statistics.median(xs) > 3  # a long tail, not a constant


def test_draws_are_cut_at_max_s():
    latency = StepLatency(dist="pareto", median_s=0.05, alpha=1.0, max_s=0.5)  # p(x > 0.5) = 10%
    xs = pooled_draws(latency, 50, 100)
    assert max(xs) == 0.5 and 0.05 < sum(x == 0.5 for x in xs) / len(xs) < 0.15
    assert min(xs) > 0


def test_latencies_are_seeded_per_episode_and_process_independent():
    latency = StepLatency()
    a = episode_latencies(latency, 3, 20)
    assert a == episode_latencies(latency, 3, 20)
    assert a[:5] == episode_latencies(latency, 3, 5)  # step k's draw does not depend on the episode length
    assert a != episode_latencies(latency, 4, 20)
    assert a != episode_latencies(StepLatency(salt=1), 3, 20)
    code = ("import json; from vagent.envs.latency import StepLatency, episode_latencies; "
            "print(json.dumps(episode_latencies(StepLatency(), 3, 20)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONHASHSEED": "123"})
    assert json.loads(out.stdout) == a


@pytest.mark.parametrize("config", [{"size": 4, "render": "vision"}, {"size": 5, "render": "text", "is_slippery": True}])
def test_episodes_are_unchanged_and_each_step_sleeps_its_draw(config):
    latency = StepLatency(median_s=0.002, sigma=1.0, max_s=0.05)
    for seed in (0, 1, 2):
        plain = episode_digest(make("frozenlake", **config), seed, 8)  # texts, pixels, states, rewards, infos
        env = LatencyEnv(make("frozenlake", **config), latency)
        t0 = time.perf_counter()
        assert episode_digest(env, seed, 8) == plain
        wall = time.perf_counter() - t0
        assert env.n_delayed >= 1
        slept = episode_latencies(latency, seed, env.n_delayed)
        assert env.total_latency_s == pytest.approx(sum(slept), abs=1e-12)
        assert env.last_latency_s == slept[-1]
        assert wall >= sum(slept)


def test_wrapper_passes_the_env_through():
    inner = make("frozenlake", size=4)
    env = LatencyEnv(inner, StepLatency(median_s=0.001, max_s=0.01))
    assert env.config is inner.config and env.spec_name == "frozenlake"
    assert env.optimal_actions == inner.optimal_actions and env.system_prompt() == inner.system_prompt()
    with pytest.raises(EnvError):  # the wrapped env's own error for a step before reset
        env.step("<answer>Left</answer>")
    assert env.n_delayed == 0
    env.close()


def test_with_latency_wraps_a_factory():
    factory = lambda: make("frozenlake", size=4)  # noqa: E731
    assert with_latency(factory, None) is factory
    env = with_latency(factory, StepLatency())()
    assert isinstance(env, LatencyEnv) and env.spec_name == "frozenlake"


def test_config_mapping_and_errors():
    assert from_mapping(StepLatency, {"dist": "pareto", "median_s": 0.1, "alpha": 2.0}) == \
        StepLatency(dist="pareto", median_s=0.1, alpha=2.0)
    with pytest.raises(ConfigError, match="unknown key 'median'"):
        from_mapping(StepLatency, {"median": 0.1})
    with pytest.raises(ConfigError, match=r"dist must be one of \('lognormal', 'pareto'\)"):
        StepLatency(dist="weibull")
    with pytest.raises(ConfigError, match="median_s must be a finite number > 0"):
        StepLatency(median_s=0.0)
    with pytest.raises(ConfigError, match="sigma must be a finite number > 0"):
        StepLatency(sigma=float("nan"))
    with pytest.raises(ConfigError, match=r"max_s \(0.01\) must be at least median_s"):
        StepLatency(median_s=0.05, max_s=0.01)
    with pytest.raises(TypeError, match="latency must be a StepLatency"):
        LatencyEnv(make("frozenlake", size=4), {"median_s": 0.1})
