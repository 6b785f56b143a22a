"""PrimitiveSkill without a copy of the simulator (issue 44, items 1 and 8): the prediction of a
reply is found on a saved copy of the state and put back (``predict_state``), an env that cannot
be deep-copied is refused with the fix, and random play and random demo actions are well-formed
skill calls."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import threading

import numpy as np
import pytest

from vagent.envs import make
from vagent.envs.formats import render_response
from vagent.envs.primitive_skill.env import parse_primitive_response, parse_skill
from vagent.recipes.demos import DemoSettings, play_demo
from vagent.rollout.scripted import solver_reply, state_after


def _reply(actions: list[str]) -> str:
    return render_response("grounding_worldmodeling", {"think": "t", "observation": "o", "reasoning": "r",
                                                       "prediction": "p", "answer": "|".join(actions)})


@pytest.mark.parametrize("task", ["align", "stack", "drawer"])
def test_predict_state_is_the_state_after_the_step_and_leaves_the_env_as_it_was(task):
    env = make("primitive_skill", task=task, render="text")
    env.reset(3)
    for _ in range(3):
        reply = _reply(env.optimal_actions()[:2])
        before = env.state()
        twin = copy.deepcopy(env)
        predicted = env.predict_state(reply)
        assert env.state() == before  # nothing moved
        twin.step(reply)
        assert predicted == twin.state()
        result = env.step(reply)  # the env's own step: the turn counts once, as the twin's did
        assert env.state() == predicted and result.truncated == False  # noqa: E712
        if result.terminated:
            break


def test_the_solver_reply_predicts_the_true_next_state_through_predict_state():
    env = make("primitive_skill", task="stack", render="text")
    env.reset(0)
    reply = solver_reply(env)
    expected = state_after(env, reply)
    env.step(reply)
    assert env.state() == expected


class _Unpicklable:
    """A SolvableEnv-shaped env holding a native handle (a lock) and no predict_state."""

    def __init__(self):
        self.lock = threading.Lock()


def test_an_env_that_cannot_be_copied_is_refused_with_the_fix():
    with pytest.raises(TypeError, match=r"cannot be deep-copied .*predict_state\(reply\) -> dict"):
        state_after(_Unpicklable(), "<answer>x</answer>")


def test_random_actions_are_well_formed_skill_calls():
    env = make("primitive_skill", task="stack", render="text")
    env.reset(0)
    rng = np.random.default_rng(0)
    draws = [env.random_action(rng) for _ in range(300)]
    assert all(not isinstance(parse_skill(a), str) for a in draws), [a for a in draws if isinstance(parse_skill(a), str)]
    assert {a.split("(")[0] for a in draws} == {"pick", "place", "push"}
    # played: some of them run (a pick at a cube's centre does)
    executed = 0
    for t in range(20):
        res = env.step(_reply([env.random_action(rng)]))
        executed += res.info["n_valid_actions"]
        assert res.info["format_ok"] and "not a skill call" not in res.obs.text
        if res.terminated or res.truncated:
            env.reset(t + 1)
    assert executed > 0


def test_vagent_play_random_makes_skill_calls():
    out = subprocess.run([sys.executable, "-m", "vagent", "play", "primitive_skill", "--policy", "random",
                          "--seed", "0", "--max-turns", "10", "--render", "text"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    infos = [json.loads(line.split("info ", 1)[1]) for line in out.stdout.splitlines() if line.startswith("  info ")]
    assert len(infos) == 10
    assert "not a skill call" not in out.stdout
    assert sum(i["n_valid_actions"] for i in infos) > 0


def test_random_demo_actions_are_skill_calls():
    settings = DemoSettings(env="primitive_skill", env_config={"task": "stack", "render": "text"}, n=1,
                            random_action_frac=0.5, max_turns=6)
    record = play_demo(settings, 0, None)
    turns = record["meta"]["turns"]
    assert any(any(t["random"]) for t in turns)
    for msg in record["messages"]:
        if msg["role"] == "assistant":
            ps = parse_primitive_response(msg["content"], "grounding_worldmodeling", 2)
            assert ps.parsed.format_ok and ps.invalid is None, (msg["content"], ps.invalid_reason)
