"""``envs.N.latency`` in a run config: the training envs of an entry with a latency take the drawn
time per step and play exactly as the plain env (in process, and on a real ``serve-env`` server);
validation envs and entries without a latency are untouched; a bad latency mapping is refused at
load in one line naming the key.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.service.conftest import ServerProc, local_transcript, replies_for, transcript_of
from vagent.config import ConfigError
from vagent.envs.latency import LatencyEnv, StepLatency, episode_latencies
from vagent.recipes.common import train_env_specs, val_env_specs
from vagent.runconfig import load_config
from vagent.rollout.driver import close_env_factories

ROOT = Path(__file__).resolve().parents[2]
BASE = ["envs.0.n_train=3", "envs.0.n_val=2", "envs.0.config.render=text"]
LATENCY = "envs.0.latency={dist: pareto, median_s: 0.02, alpha: 1.5, max_s: 0.15, salt: 7}"
EXPECTED = StepLatency(dist="pareto", median_s=0.02, alpha=1.5, max_s=0.15, salt=7)
MOVES = ("Left", "Down", "Right", "Up")


def timed_steps(env, seed: int, replies: list[str]) -> list[float]:
    """Wall seconds of each ``step`` of ``replies`` after ``reset(seed)`` (stops at the episode's end)."""
    env.reset(seed)
    out = []
    for reply in replies:
        t0 = time.perf_counter()
        result = env.step(reply)
        out.append(time.perf_counter() - t0)
        if result.terminated or result.truncated:
            break
    return out


def test_train_envs_take_the_drawn_time_and_play_as_the_plain_env():
    cfg = load_config(None, BASE + [LATENCY])
    plain = train_env_specs(load_config(None, BASE), 0)
    specs = train_env_specs(cfg, 0)
    assert [s.seed for s in specs] == [s.seed for s in plain] and all(s.factory is None for s in plain)
    slept, drawn = 0.0, 0.0
    for i, spec in enumerate(specs):
        replies = replies_for(MOVES, 6, i)
        env = spec.factory()
        assert isinstance(env, LatencyEnv) and env.latency == EXPECTED
        times = timed_steps(env, spec.seed, replies)
        draws = episode_latencies(EXPECTED, spec.seed, len(times))
        assert all(t >= d for t, d in zip(times, draws)), (times, draws)  # each step sleeps its own draw
        assert env.total_latency_s == pytest.approx(sum(draws))
        slept, drawn = slept + sum(times), drawn + sum(draws)
        again = spec.factory()  # a fresh env of the same spec plays the plain env's transcript
        assert transcript_of(again, spec.seed, replies) == local_transcript(spec.name, dict(spec.config), spec.seed,
                                                                             replies)
    assert drawn > 0 and slept - drawn < 1.0 + 0.05 * len(specs), (slept, drawn)  # no extra sleep beyond the draws


def test_validation_envs_and_entries_without_latency_are_unchanged():
    cfg = load_config(None, ["envs=[{name: frozenlake, n_train: 3, n_val: 2, latency: {median_s: 0.01}}, "
                             "{name: frozenlake, n_train: 2, n_val: 1}]"])
    assert cfg.envs[1].latency is None
    assert all(s.factory is None for s in val_env_specs(cfg.envs[0]))  # validation: no latency
    specs = train_env_specs(cfg, 0)
    assert [s.factory is None for s in specs] == [False] * 3 + [True] * 2


def test_a_remote_entry_wraps_its_remote_env(tmp_path):
    server = ServerProc(log_dir=tmp_path).start()
    try:
        cfg = load_config(None, BASE + [LATENCY, f"envs.0.urls=[{server.url}]"])
        spec = train_env_specs(cfg, 0)[0]
        env = spec.factory()
        assert isinstance(env, LatencyEnv) and type(env.env).__name__ == "RemoteEnv"
        replies = replies_for(MOVES, 4, 1)
        times = timed_steps(env, spec.seed, replies)
        assert all(t >= d for t, d in zip(times, episode_latencies(EXPECTED, spec.seed, len(times))))
        assert transcript_of(spec.factory(), spec.seed, replies) == local_transcript(
            spec.name, dict(spec.config), spec.seed, replies)
    finally:
        close_env_factories()
        server.stop()


@pytest.mark.parametrize("override, expected", [
    ("envs.0.latency.medain_s=0.1", "envs.0.latency: unknown key 'medain_s'. Did you mean 'median_s'? Valid keys: "
                                    "dist, median_s, sigma, alpha, max_s, salt."),
    ("envs.0.latency.dist=cauchy", "envs.0.latency: step latency dist must be one of ('lognormal', 'pareto')"),
    ("envs.0.latency.alpha=0", "envs.0.latency: step latency alpha must be a finite number > 0, got 0"),
    ("envs.0.latency={median_s: 1, max_s: 0.5}", "envs.0.latency: step latency max_s (0.5) must be at least median_s"),
    ("envs.0.latency.median_s=fast", "envs.0.latency.median_s: expected a number, got 'fast'"),
])
def test_a_bad_latency_is_one_line_naming_the_key(override, expected):
    with pytest.raises(ConfigError) as info:
        load_config(None, [override])
    assert str(info.value).startswith(expected) and "\n" not in str(info.value), str(info.value)


def test_vagent_train_refuses_a_bad_latency_in_one_line(tmp_path):
    out = subprocess.run([sys.executable, "-m", "vagent", "train", f"out_dir={tmp_path}", "envs.0.latency.sigmaa=2"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    err = out.stderr.strip().splitlines()
    assert out.returncode != 0 and len(err) == 1, out.stderr
    assert "envs.0.latency: unknown key 'sigmaa'. Did you mean 'sigma'?" in err[0], err
    assert not list(tmp_path.iterdir())  # refused before a run directory was made
