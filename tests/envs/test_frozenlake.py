"""FrozenLake: map generation, transitions, rewards, slipping, prompts, descriptions, solver."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

from vagent.config import ConfigError
from vagent.envs import EnvError, EpisodeOverError, make
from vagent.envs.frozenlake import (
    ACTIONS, FrozenLakeEnv, describe_state, generate_map, move, parse_frozenlake_response, progress_steps,
    shortest_path, slip, state_from_grid,
)

MAP = ("P_O_", "_O__", "____", "O__G")  # start (0,0), goal (3,3)


def test_generated_maps_are_solvable_and_seeded():
    for seed in range(200):
        holes, start, goal = generate_map(np.random.default_rng(seed), 4, 0.8)
        assert start != goal and start not in holes and goal not in holes
        assert shortest_path(4, holes, start, goal) is not None
    a = generate_map(np.random.default_rng(7), 6, 0.7)
    b = generate_map(np.random.default_rng(7), 6, 0.7)
    assert a == b
    maps = {generate_map(np.random.default_rng(s), 4, 0.8) for s in range(50)}
    assert len(maps) > 40  # start and goal are random, not fixed corners
    holes, _, _ = generate_map(np.random.default_rng(0), 5, 1.0)
    assert holes == frozenset()


def test_shortest_path_hand_derived():
    holes = frozenset({(0, 2), (1, 1), (3, 0)})
    # from (0,0) to (3,3): 6 moves is the Manhattan distance; (1,1) blocks the diagonal middle
    path = shortest_path(4, holes, (0, 0), (3, 3))
    assert len(path) == 6
    cell = (0, 0)
    for a in path:
        cell = move(4, cell, a)
        assert cell not in holes
    assert cell == (3, 3)
    assert shortest_path(2, frozenset({(0, 1), (1, 0)}), (0, 0), (1, 1)) is None
    assert move(4, (0, 0), "Up") == (0, 0) and move(4, (0, 0), "Left") == (0, 0)


def test_step_semantics_on_a_fixed_map(reply):
    env = make("frozenlake", fixed_map=MAP, format="no_think")
    env.reset(0)
    res = env.step(reply("no_think", ["Right"]))
    assert env.state()["player"] == [0, 1]
    assert res.reward == pytest.approx(0.02) and not res.terminated and not res.truncated
    assert res.info["action_is_valid"] and res.info["action_is_effective"] and res.info["n_valid_actions"] == 1
    # walking into the top edge: valid but not effective, still gets the format bonus
    res = env.step(reply("no_think", ["up"]))
    assert not res.info["action_is_effective"] and res.info["action_is_valid"] and res.reward == pytest.approx(0.02)
    # an unknown action stops execution: Down runs, "jump" stops, Right never runs
    res = env.step(reply("no_think", ["Down", "jump", "Right"]))
    assert env.state()["player"] == [1, 1] and res.terminated  # (1,1) is a hole
    assert res.info["fell_in_hole"] and not res.info["success"] and not res.info["action_is_valid"]
    assert res.info["executed_actions"] == ["Down"] and res.reward == pytest.approx(0.02)
    assert env.state()["grid"][1] == "_X__"
    with pytest.raises(EpisodeOverError, match="reset"):
        env.step(reply("no_think", ["Down"]))


def test_success_and_reward_presets(reply):
    for preset, success, fmt_bonus in (("lite", 1.0, 0.02), ("paper", 10.0, 0.5)):
        env = make("frozenlake", fixed_map=MAP, format="free_think", rewards=preset, max_actions_per_turn=6)
        env.reset(1)
        res = env.step(reply("free_think", env.optimal_actions()))
        assert res.terminated and res.info["success"] and not res.truncated
        assert res.reward == pytest.approx(success + fmt_bonus)
        assert env.state()["grid"][3] == "O__*"
    env = make("frozenlake", fixed_map=MAP, rewards="paper", reward_format=0.0, reward_success=3.0,
               max_actions_per_turn=6)
    env.reset(0)
    assert env.rewards == {"success": 3.0, "format": 0.0, "progress": 0.0}
    assert env.step(reply(env.config.format, env.optimal_actions())).reward == pytest.approx(3.0)
    with pytest.raises(ConfigError, match="Did you mean 'paper'"):
        make("frozenlake", rewards="papr")


def test_progress_shaping_counts_bfs_moves(reply):
    # MAP: start (0,0), goal (3,3), holes (0,2) (1,1) (3,0); BFS distance from (0,0) is 6
    holes = frozenset({(0, 2), (1, 1), (3, 0)})
    assert progress_steps(4, holes, (3, 3), (0, 0), (1, 0)) == 1    # one move along the path
    assert progress_steps(4, holes, (3, 3), (1, 0), (0, 0)) == -1   # back
    assert progress_steps(4, holes, (3, 3), (0, 0), (2, 1)) == 3    # a whole turn of three moves
    assert progress_steps(4, holes, (3, 3), (0, 1), (0, 2)) == -1   # into a hole: one move away
    assert progress_steps(4, holes, (3, 3), (0, 0), (0, 0)) == 0
    # off by default (VAGEN's rewards); with reward_progress each turn adds coef x moves closer
    env = make("frozenlake", fixed_map=MAP, format="no_think")
    env.reset(0)
    assert env.step(reply("no_think", ["Down", "Down"])).reward == pytest.approx(0.02)
    env = make("frozenlake", fixed_map=MAP, format="no_think", reward_progress=0.1)
    env.reset(0)
    assert env.step(reply("no_think", ["Down", "Down"])).reward == pytest.approx(0.02 + 0.2)
    assert env.step(reply("no_think", ["Up"])).reward == pytest.approx(0.02 - 0.1)
    assert env.step(reply("no_think", ["Right"])).reward == pytest.approx(0.02 - 0.1)  # (1,1) is a hole
    env2 = make("frozenlake", fixed_map=MAP, format="no_think", reward_progress=0.1)
    env2.reset(0)
    path = env2.optimal_actions()
    total = sum(env2.step(reply("no_think", [a])).reward for a in path)
    assert total == pytest.approx(1.0 + 0.02 * len(path) + 0.1 * 6)  # success + format + 6 moves closer


def test_actions_capped_and_format_failure(reply):
    env = make("frozenlake", fixed_map=MAP, format="no_think", max_actions_per_turn=2)
    env.reset(0)
    res = env.step(reply("no_think", ["Right", "Down", "Down"]))  # (0,1) -> (1,1) would be a hole: capped
    assert res.info["executed_actions"] == ["Right", "Down"] and res.terminated  # (1,1) is a hole
    env.reset(0)
    res = env.step("Right")  # no tags: format failure, nothing runs
    assert not res.info["format_ok"] and res.info["format_error"] and res.reward == 0.0
    assert env.state()["player"] == [0, 0] and not res.info["action_is_effective"]
    assert "format error" in res.obs.text


def test_truncation_counts_turns(reply):
    env = make("frozenlake", fixed_map=MAP, format="no_think", max_steps=3)
    env.reset(0)
    flags = [env.step(reply("no_think", ["Up"])).truncated for _ in range(3)]
    assert flags == [False, False, True]
    with pytest.raises(EpisodeOverError):
        env.step(reply("no_think", ["Up"]))
    env.reset(0)  # a new episode after truncation
    assert not env.step(reply("no_think", ["Up"])).truncated


def test_errors_before_reset():
    env = FrozenLakeEnv()
    with pytest.raises(EnvError, match="reset"):
        env.step("<answer>Up</answer>")
    with pytest.raises(EnvError, match="reset"):
        env.state()
    env.close()
    env.close()
    env.reset(0)
    env.close()
    with pytest.raises(EnvError, match="reset"):  # a closed env needs a new reset
        env.step("<answer>Up</answer>")


def test_slip_distribution_and_seeded_slippery_episodes(reply, trajectory):
    rng = np.random.default_rng(0)
    counts = Counter(slip("Down", rng) for _ in range(3000))
    assert set(counts) == {"Down", "Left", "Right"}  # never the opposite direction
    assert all(abs(n / 3000 - 1 / 3) < 0.04 for n in counts.values())

    def cells(seed):
        env = make("frozenlake", is_slippery=True, p=1.0, size=5, format="no_think", max_steps=10)
        return trajectory(env, seed, reply("no_think", ["Down", "Right"]), 10, lambda e: tuple(e.state()["player"]))

    assert cells(3) == cells(3)
    assert len({tuple(cells(s)) for s in range(8)}) > 1


def test_prompt_mentions_slippery_only_when_slippery():
    assert "slippery" not in make("frozenlake").system_prompt().lower()
    assert "slippery" in make("frozenlake", is_slippery=True).system_prompt().lower()
    prompt = make("frozenlake", render="text").system_prompt()
    assert "legend" in prompt.lower() and "Example reply" in prompt
    for fmt in ("no_think", "free_think", "grounding", "worldmodeling", "grounding_worldmodeling"):
        for style in ("natural", "structured", "symbolic"):
            prompt = make("frozenlake", format=fmt, description_style=style).system_prompt()
            example = prompt.split("Example reply:\n", 1)[1]
            parsed = parse_frozenlake_response(example, fmt, 5)
            assert parsed.all_valid, (fmt, style, parsed)


def test_observation_text_and_image():
    env = make("frozenlake", fixed_map=MAP, image_size=64)
    obs, _ = env.reset(0)
    assert obs.text.count("<image>") == 1 and obs.images[0].size == (64, 64) and obs.images[0].mode == "RGB"
    assert "Last reply" not in obs.text and "Answer in the format" in obs.text
    pixels = {tuple(p) for p in np.asarray(obs.images[0]).reshape(-1, 3)}
    for color in ((200, 230, 250), (20, 40, 90), (240, 190, 30), (220, 40, 40)):  # ice, hole, goal, player
        assert color in pixels, color
    text_env = make("frozenlake", fixed_map=MAP, render="text")
    obs, _ = text_env.reset(0)
    assert obs.images == () and "\n".join(MAP) in obs.text


def test_state_and_relations():
    state = state_from_grid(MAP)
    json.dumps(state)
    assert state["player"] == [0, 0] and state["goal"] == [3, 3]
    assert state["holes"] == [[0, 2], [1, 1], [3, 0]]
    assert state["relations"] == [
        {"object": "goal", "vertical": "below", "horizontal": "right"},
        {"object": "hole", "vertical": "same", "horizontal": "right"},
        {"object": "hole", "vertical": "below", "horizontal": "right"},
        {"object": "hole", "vertical": "below", "horizontal": "same"},
    ]
    assert FrozenLakeEnv.judge_spec.object_weights == {"goal": 0.7, "hole": 0.3}


def test_describe_state_styles():
    state = state_from_grid(("_G", "PO"))
    assert describe_state(state, "natural") == (
        "The goal is above and to the right of you. The hole is to the right of you, in the same row.")
    assert json.loads(describe_state(state, "structured")) == {"goal": ["above", "right"], "hole": ["same", "right"]}
    assert describe_state(state, "symbolic") == "_G\nPO"
    two = state_from_grid(("OG_", "_P_", "__O"))
    assert json.loads(describe_state(two, "structured"))["hole"] == [["above", "left"], ["below", "right"]]
    assert "Hole 2 is below and to the right of you." in describe_state(two, "natural")
    with pytest.raises(ValueError, match="natural"):
        describe_state(state, "poetic")


def test_parse_frozenlake_response_mapping():
    pa = parse_frozenlake_response("<answer> left , DOWN,Right </answer>", "no_think")
    assert pa.actions == ("Left", "Down", "Right") and pa.all_valid
    pa = parse_frozenlake_response("<answer>Left, fly, Up</answer>", "no_think")
    assert pa.actions == ("Left",) and pa.unknown == "fly" and not pa.all_valid
    pa = parse_frozenlake_response("<answer>" + ",".join(["Up"] * 9) + "</answer>", "no_think", max_actions=5)
    assert pa.actions == ("Up",) * 5 and pa.parsed.n_dropped_actions == 4
    assert parse_frozenlake_response("Up", "no_think").actions == ()
    assert set(ACTIONS) == {"Left", "Down", "Right", "Up"}


def test_solver_reaches_goal_for_many_seeds(reply):
    env = make("frozenlake", format="no_think", size=5, p=0.7)
    for seed in range(30):
        env.reset(seed)
        for _ in range(10):
            res = env.step(reply("no_think", env.optimal_actions()[:5]))
            if res.terminated or res.truncated:
                break
        assert res.info["success"], seed
        assert env.optimal_actions() == [] or env.state()["player"] == env.state()["goal"]


def test_bad_config_errors():
    for kwargs, match in (
        ({"size": 1}, "size"), ({"p": 0.0}, "p"), ({"render": "3d"}, "render"),
        ({"format": "grounding_world"}, "Did you mean"), ({"fixed_map": ["PO", "OG"]}, "no path"),
        ({"fixed_map": ["P_", "__"]}, "exactly one P"), ({"max_actions_per_turn": 0}, "max_actions_per_turn"),
        ({"sizee": 4}, "Did you mean 'size'"), ({"image_size": 2}, "image_size"),
    ):
        with pytest.raises(ConfigError, match=match):
            make("frozenlake", **kwargs)
