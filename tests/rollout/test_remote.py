"""Remote envs through EnvSpec factories: a real env server on loopback gives the local episodes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.service.conftest import free_port, wait_healthy
from vagent.rollout import EnvSpec, SamplingConfig, TokenScriptedPolicy, rollout
from vagent.rollout.batch import build_token_batch

ROOT = Path(__file__).resolve().parents[2]
CFG = {"format": "free_think", "max_actions_per_turn": 2}
REPLIES = ["<think>down</think><answer>Down,Right</answer>", "<think>left</think><answer>Left</answer>",
           "<think>up</think><answer>Up,Up</answer>"]


@pytest.fixture(scope="module")
def server_url(tmp_path_factory):
    port = free_port()
    log = tmp_path_factory.mktemp("env_server") / "server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "vagent.service.server", "--port", str(port), "--envs",
                                 "frozenlake"], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(proc, url, 60, lambda: log.read_text(errors="replace")[-2000:])
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def reply(conv):
    n_user = sum(m.role == "user" for m in conv.messages)
    return REPLIES[(n_user - 1) % len(REPLIES)]


def test_remote_env_episodes_equal_local_ones(server_url, encoder):
    from vagent.service.client import RemoteEnv

    local_specs = [EnvSpec("frozenlake", CFG, seed) for seed in range(4)]
    remote_specs = [EnvSpec("frozenlake", CFG, seed, factory=lambda: RemoteEnv(server_url, "frozenlake", **CFG))
                    for seed in range(4)]
    policy = TokenScriptedPolicy(encoder, reply)
    sampling = SamplingConfig(max_new_tokens=32)
    local = rollout(local_specs, policy, sampling, max_turns=3, group_size=2)
    remote = rollout(remote_specs, policy, sampling, max_turns=3, group_size=2)
    assert remote.metrics["rollout/errors"] == 0
    for a, b in zip(local, remote):
        assert [t.reward for t in a.turns] == [t.reward for t in b.turns]
        assert [t.state_before for t in a.turns] == [t.state_before for t in b.turns]
        assert [t.parsed for t in a.turns] == [t.parsed for t in b.turns]
        assert [t.observation.text for t in a.turns] == [t.observation.text for t in b.turns]
        assert [t.observation.images[0].tobytes() for t in a.turns] == [t.observation.images[0].tobytes() for t in b.turns]
        assert (a.terminated, a.truncated) == (b.terminated, b.truncated)
    ba = build_token_batch(local, mode="concat", pad_token_id=encoder.pad_token_id)
    bb = build_token_batch(remote, mode="concat", pad_token_id=encoder.pad_token_id)
    assert ba.input_ids.equal(bb.input_ids) and ba.pixel_values.equal(bb.pixel_values)
