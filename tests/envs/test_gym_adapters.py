"""Gymnasium adapters: vagent envs pass gymnasium's checker; gymnasium envs become vagent envs."""

from __future__ import annotations

import warnings

import gymnasium
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env as gym_check_env

from vagent.config import ConfigError
from vagent.envs import EnvError, make
from vagent.envs.checker import check_env
from vagent.envs.gym_adapters import FromGymnasium, GymnasiumEnv, strip_ansi, to_jsonable


@pytest.mark.parametrize("render", ["vision", "text"])
@pytest.mark.parametrize("name", ["sokoban", "frozenlake"])
def test_vagent_env_passes_gymnasium_checker(name, render):
    env = GymnasiumEnv(make(name, render=render), render_mode="rgb_array")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gym_check_env(env)
    # the only acceptable warning: an env not made by gymnasium.make has no spec to remake it with
    assert [str(w.message) for w in caught if "not having a spec" not in str(w.message)] == []
    obs, _ = env.reset(seed=5)
    assert obs["image"].shape == (96, 96, 3) and obs["image"].dtype == np.uint8
    assert (obs["image"].max() > 0) == (render == "vision")
    assert obs in env.observation_space
    obs2, reward, terminated, truncated, info = env.step("<answer>Up</answer>")
    assert isinstance(reward, float) and "format_ok" in info and obs2 in env.observation_space


def test_gymnasium_env_seeding_and_text_limits():
    env = GymnasiumEnv(make("frozenlake", render="text", format="no_think"))
    a, _ = env.reset(seed=3)
    b, _ = env.reset(seed=3)
    assert a["text"] == b["text"]
    # a reply echoed into the feedback line with characters outside the charset: replaced, never invalid
    obs, *_ = env.step("<answer>Up, \u2603</answer>")
    assert "?" in obs["text"] and obs in env.observation_space
    small = GymnasiumEnv(make("frozenlake", render="text"), max_text_len=50)
    with pytest.raises(EnvError, match="max_text_len"):
        small.reset(seed=0)
    with pytest.raises(ValueError, match="replacement"):
        GymnasiumEnv(make("frozenlake"), charset="abc", replacement="?")


def test_from_gymnasium_frozenlake_hand_derived(reply):
    # FrozenLake-v1 4x4 map: SFFF / FHFH / FFFH / HFFG; the shortest path below reaches G.
    env = make("gym", format="no_think", max_actions_per_turn=6)
    obs, _ = env.reset(0)
    assert obs.images[0].size == (96, 96)
    res = env.step(reply("no_think", ["down", "Down", "Right", "Right", "Down", "Right"]))
    assert res.terminated and res.info["success"] and res.info["env_reward"] == 1.0
    assert res.reward == pytest.approx(1.0 + 0.1)
    env.reset(0)
    res = env.step(reply("no_think", ["Right", "Down"]))  # (0,1) -> (1,1) is a hole
    assert res.terminated and not res.info["success"] and res.reward == pytest.approx(0.1)
    assert env.state()["observation"] == 5


def test_from_gymnasium_slippery_is_seeded(reply, trajectory):
    def run(seed):
        env = make("gym", format="no_think", env_kwargs={"is_slippery": True}, max_steps=6)
        return trajectory(env, seed, reply("no_think", ["Right", "Down"]), 6, lambda e: e.state()["observation"])

    assert run(4) == run(4)
    assert len({tuple(run(s)) for s in range(6)}) > 1


def test_from_gymnasium_cliffwalking_text_and_instances():
    env = FromGymnasium("CliffWalking-v1", ["Up", "Right", "Down", "Left"], render="text", env_kwargs={},
                        description="Walk along the cliff to the goal T.")
    obs, _ = env.reset(0)
    assert obs.images == () and "T" in obs.text and "\x1b" not in obs.text
    assert "cliff" in env.system_prompt()
    check_env(lambda: FromGymnasium("CliffWalking-v1", ["Up", "Right", "Down", "Left"], env_kwargs={}),
              check_subprocess=False)
    wrapped = FromGymnasium(gymnasium.make("CliffWalking-v1", render_mode="rgb_array"), ["Up", "Right", "Down", "Left"])
    obs, _ = wrapped.reset(1)
    assert obs.images[0].size == (96, 32)  # 768 x 256 frame, longer side scaled to 96


def test_from_gymnasium_errors():
    with pytest.raises(ConfigError, match="4 actions"):
        make("gym", action_names=["Left", "Right"])
    with pytest.raises(ConfigError, match="render_mode='rgb_array'"):
        FromGymnasium(gymnasium.make("FrozenLake-v1", render_mode="ansi"), ["L", "D", "R", "U"])
    with pytest.raises(ConfigError, match="not a registered gymnasium id"):
        make("gym", env_id="NoSuchEnv-v0")
    with pytest.raises(ConfigError, match="differ"):
        make("gym", action_names=["a", "A", "b", "c"])


def test_strip_ansi_and_to_jsonable():
    assert strip_ansi("  (Down)\n\x1b[41mS\x1b[0mFFF\nFHFH\n") == "  (Down)\n[S]FFF\nFHFH"
    assert strip_ansi("\x1b[1mbold\x1b[0m") == "bold"
    assert to_jsonable({"a": np.int64(3), "b": np.arange(2), "c": (np.float32(0.5),)}) == {"a": 3, "b": [0, 1], "c": [0.5]}
