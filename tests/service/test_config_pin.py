"""A restored episode is never continued under another env config.

Servers of one URL list can be configured differently by their operators (``--env-config``). A
session carries the hash of its env's resolved config; a restore (replay) or a new session of the
same RemoteEnv sent to a server that resolves the config differently is refused there (409
``ConfigMismatch``), and the client tries the next server, or fails naming the fields that differ.
"""

from __future__ import annotations

import httpx
import pytest

from tests.service.test_faults import Player
from vagent.service import RemoteEnv, RemoteEnvPool, step_many
from vagent.service import protocol as P
from vagent.service.client import EnvConfigMismatch

# a hole-free 6x6 lake: episodes run to max_steps unless the goal is reached

CONFIG = {"format": "no_think", "size": 6, "p": 1.0}
SHORT = ("--env-config", "frozenlake.max_steps=3")


def test_replay_onto_a_server_with_another_config_is_refused(start_server):
    a, b = start_server(), start_server(*SHORT)
    env = RemoteEnv([a.url, b.url], "frozenlake", retry_timeout=10, **CONFIG)
    p = Player(env, "frozenlake", CONFIG, 8)
    p.step()
    p.step()
    a.kill()
    with pytest.raises(EnvConfigMismatch, match=r"max_steps"):
        p.step()  # before: replayed on b, and the episode truncated at b's step 3
    assert b.metrics()["service/replays_served"] == 0
    env.close()


def test_the_next_server_with_the_same_config_takes_the_replay(start_server):
    a, b, c = start_server(), start_server(*SHORT), start_server()
    env = RemoteEnv([a.url, b.url, c.url], "frozenlake", retry_timeout=10, **CONFIG)
    p = Player(env, "frozenlake", CONFIG, 8)
    p.step()
    p.step()
    a.kill()
    while not p.done:
        p.step()
    p.check()  # the whole episode equals a local one: b's max_steps=3 never applied
    assert b.metrics()["service/replays_served"] == 0
    assert c.metrics()["service/replays_served"] == 1
    env.close()


def test_batch_restore_skips_a_server_with_another_config(start_server):
    a, b, c = start_server(), start_server(*SHORT), start_server()
    pool = RemoteEnvPool([a.url, b.url, c.url], "frozenlake", 2, retry_timeout=10, **CONFIG)
    ps = [Player(e, "frozenlake", CONFIG, 8 + i) for i, e in enumerate(pool)]
    for _ in range(2):
        for p, r in zip(ps, step_many(list(pool), [p.replies[len(p.seen) - 1] for p in ps])):
            p.record(r)
    a.kill()
    while not all(p.done for p in ps):
        live = [p for p in ps if not p.done]
        for p, r in zip(live, step_many([p.env for p in live], [p.replies[len(p.seen) - 1] for p in live])):
            p.record(r)
    for p in ps:
        p.check()
    assert b.metrics()["service/replays_served"] == 0
    pool.close()


def test_batch_restore_with_no_matching_server_fails_with_the_reason(start_server):
    a, b = start_server(), start_server(*SHORT)
    pool = RemoteEnvPool([a.url, b.url], "frozenlake", 2, retry_timeout=10, **CONFIG)
    pool.reset([1, 2])
    a.kill()
    with pytest.raises(EnvConfigMismatch, match=r"max_steps 20 -> 3"):
        pool.step(["<answer>Right</answer>"] * 2)
    pool.close()


def test_a_new_session_after_a_lost_one_keeps_the_config(start_server):
    """Between episodes too: a RemoteEnv whose server died does not reset onto another config."""
    a, b = start_server(), start_server(*SHORT)
    env = RemoteEnv([a.url, b.url], "frozenlake", retry_timeout=10, **CONFIG)
    env.reset(1)
    a.kill()
    with pytest.raises(EnvConfigMismatch, match="max_steps"):
        env.reset(2)
    env.close()


def test_the_server_answers_a_wrong_hash_with_409_and_its_config(server):
    body = {"env": "frozenlake", "config": CONFIG, "seed": 1, "replay": [], "config_hash": "0" * 16}
    # the server is the session's: other tests' sessions may be open on it, so count this request's
    before = httpx.get(f"{server.url}/health").json()["sessions"]
    r = httpx.post(f"{server.url}{P.API_PREFIX}/sessions", json=body)
    assert r.status_code == 409, r.text
    err = r.json()
    assert err["error"] == "ConfigMismatch" and err["config"]["max_steps"] == 20
    assert httpx.get(f"{server.url}/health").json()["sessions"] == before  # nothing left behind
    right = P.config_hash("frozenlake", err["config"])
    r = httpx.post(f"{server.url}{P.API_PREFIX}/sessions", json={**body, "config_hash": right})
    assert r.status_code == 200
    header, _ = P.decode_frames(r.content)
    assert header["config_hash"] == right
    httpx.delete(f"{server.url}{P.API_PREFIX}/sessions/{header['session_id']}")
