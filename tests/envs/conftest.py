"""Shared fixtures of the env tests."""

from __future__ import annotations

import pytest

from vagent.envs.formats import render_response


def make_reply(fmt: str, actions, text: str = "a description") -> str:
    """A correctly formatted reply in ``fmt`` whose answer is ``actions`` joined by ','."""
    answer = actions if isinstance(actions, str) else ",".join(actions)
    return render_response(fmt, {"think": text, "observation": text, "reasoning": text, "prediction": text,
                                 "answer": answer})


@pytest.fixture
def reply():
    return make_reply


def play(env, seed: int, reply: str, steps: int, observe) -> list:
    """``observe(env)`` after each step of ``reply``, from ``env.reset(seed)`` for at most ``steps``
    steps or until the episode ends (a seeded env's trajectory, to compare across seeds)."""
    env.reset(seed)
    out = []
    for _ in range(steps):
        res = env.step(reply)
        out.append(observe(env))
        if res.terminated or res.truncated:
            break
    return out


@pytest.fixture
def trajectory():
    return play
