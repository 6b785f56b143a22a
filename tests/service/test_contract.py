"""RemoteEnv keeps the env contract: check_env, equality with local runs, errors, batches."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from tests.service.conftest import local_transcript, replies_for, transcript_of
from vagent.config import ConfigError
from vagent.envs import EnvError, EpisodeOverError, SolvableEnv, check_env, list_envs, make
from vagent.service import (
    RemoteEnv, RemoteEnvException, RemoteEnvPool, remote_env_factory, remote_spec_factory, reset_many, step_many,
)

BUILTIN = list_envs(builtin_only=True)


def _builtin_ok(name: str) -> bool:
    try:
        from vagent.envs import env_class

        env_class(name)
        return True
    except (ImportError, AttributeError):
        return False


@pytest.mark.parametrize("name", BUILTIN)
def test_check_env_over_remote_env(server, name):
    """The checker, fresh-process determinism included: the remote episode equals a local one."""
    if not _builtin_ok(name):
        pytest.skip(f"built-in env {name!r} is not importable in this tree yet")
    report = check_env(lambda: RemoteEnv(server.url, name), n_steps=4)
    assert "determinism in a fresh process" in report.checks
    local = check_env(lambda: make(name), n_steps=4, check_subprocess=False)
    assert report.warnings == local.warnings


def test_check_env_over_remote_toy(server):
    report = check_env(lambda: RemoteEnv(server.url, "svc_toy", format="no_think"), check_subprocess=False)
    assert "garbage replies (8) never raise and fail the format" in report.checks


@pytest.mark.parametrize("name,config,images", [
    ("frozenlake", {"format": "no_think", "size": 5, "p": 0.85}, "auto"),
    ("frozenlake", {"format": "no_think", "size": 5, "p": 0.85, "image_size": 64}, "png"),
    ("sokoban", {"format": "no_think", "image_size": 48}, "zlib"),
    ("frozenlake", {"format": "no_think", "render": "text"}, "auto"),
    ("svc_toy", {"format": "no_think"}, "raw"),
])
def test_remote_episodes_equal_local(server, name, config, images):
    """Pixel-identical observations in every image codec (auto = raw pixels on loopback)."""
    env = RemoteEnv(server.url, name, images=images, **config)
    assert env._t.images == ("raw" if images == "auto" else images)
    try:
        for seed in (3, 11, 42):
            replies = replies_for(env.action_names, 25, seed)
            assert transcript_of(env, seed, replies) == local_transcript(name, config, seed, replies)
    finally:
        env.close()


def test_mirrored_attributes_and_solver(server):
    env = RemoteEnv(server.url, "frozenlake", format="free_think", max_actions_per_turn=2)
    assert env.config.format == "free_think" and env.config.max_actions_per_turn == 2 and env.config.size == 4
    assert env.action_names == ("Left", "Down", "Right", "Up") and env.action_sep == ","
    assert env.judge_spec is not None and env.judge_spec.object_weights == {"goal": 0.7, "hole": 0.3}
    assert env.spec_name == "frozenlake" and env.spec_config == {"format": "free_think", "max_actions_per_turn": 2}
    assert isinstance(env, SolvableEnv)
    env.reset(5)
    local = make("frozenlake", format="free_think", max_actions_per_turn=2)
    local.reset(5)
    assert env.optimal_actions() == local.optimal_actions() != []
    env.close()
    plain = RemoteEnv(server.url, "svc_toy_nosolver")
    assert not hasattr(plain, "optimal_actions") and not isinstance(plain, SolvableEnv)
    plain.close()


def test_errors_map_to_the_local_exceptions(server):
    with pytest.raises(KeyError, match="Did you mean 'frozenlake'"):
        RemoteEnv(server.url, "frozenlak")
    with pytest.raises(ConfigError, match="unknown key 'sise'.*Did you mean 'size'"):
        RemoteEnv(server.url, "frozenlake", sise=4)
    env = RemoteEnv(server.url, "svc_toy", format="no_think", max_steps=2)
    with pytest.raises(EnvError, match="before reset"):
        env.step("<answer>Left</answer>")
    with pytest.raises(EnvError):
        env.state()
    assert "Walk left or right" in env.system_prompt()  # works before reset, as locally
    env.reset(0)
    env.step("<answer>Left</answer>")
    env.step("<answer>Left</answer>")
    with pytest.raises(EpisodeOverError):
        env.step("<answer>Left</answer>")
    env.reset(1)  # usable after a 409
    env.step("<answer>Left</answer>")
    env.close()
    with pytest.raises(EnvError, match="closed"):
        env.step("<answer>Left</answer>")


def test_env_exception_is_an_error_never_a_reward(server):
    env = RemoteEnv(server.url, "svc_toy", format="no_think")
    env.reset(7)
    first = env.step("<answer>Right</answer>")
    with pytest.raises(RemoteEnvException, match="toy env exploded on purpose") as info:
        env.step("__boom__")
    assert info.value.session_closed
    with pytest.raises(RemoteEnvException, match="non-finite reward"):
        env.step("__nan__")
    # the client still holds the episode: the next step restores it by replay and goes on
    nxt = env.step("<answer>Right</answer>")
    ref = local_transcript("svc_toy", {"format": "no_think"}, 7, ["<answer>Right</answer>"] * 2)
    assert (first.reward, nxt.obs.text) == (ref[1][2], ref[2][0])
    m = server.metrics()
    assert m["service/env_errors"] >= 2 and m["service/errors_5xx"] >= 2
    env.close()


def test_pool_and_batch_helpers_equal_local(server):
    cfg = {"format": "no_think", "p": 0.9}
    seeds = [100, 101, 102, 103, 104]
    with RemoteEnvPool(server.url, "frozenlake", len(seeds), **cfg) as pool:
        obs = pool.reset(seeds)
        replies = {s: replies_for(pool[0].action_names, 12, s) for s in seeds}
        got = {s: [(o.text, [im.tobytes() for im in o.images], None)] for s, (o, _) in zip(seeds, obs)}
        live = list(range(len(seeds)))
        for t in range(12):
            res = step_many([pool[i] for i in live], [replies[seeds[i]][t] for i in live])
            for i, r in zip(live, res):
                got[seeds[i]].append((r.obs.text, [im.tobytes() for im in r.obs.images], r.reward))
            live = [i for i, r in zip(live, res) if not (r.terminated or r.truncated)]
            if not live:
                break
        for s in seeds:
            ref = local_transcript("frozenlake", cfg, s, replies[s])
            assert got[s] == [(x[0], [b for _, _, b in x[1]], x[2]) for x in ref]
        # per-item errors: one env past its end, the others step fine
        reset_many(list(pool), seeds)
        out = step_many(list(pool), ["<answer>Up</answer>"] * len(seeds), return_exceptions=True)
        assert all(not isinstance(x, Exception) for x in out)
        sessions = server.metrics()["service/sessions_active"]
    assert server.metrics()["service/sessions_active"] == sessions - len(seeds)


def test_factories_plug_into_rollout(server):
    from vagent.rollout.loop import EnvSpec, rollout
    from vagent.rollout.policy import SamplingConfig
    from vagent.rollout.scripted import RandomPolicy

    make_env = remote_env_factory(server.url, "frozenlake", format="no_think")
    a, b = make_env(), make_env()
    assert a.session_id != b.session_id and a._t is b._t
    a.close(), b.close()
    specs = [EnvSpec("frozenlake", {"format": "no_think"}, seed=s) for s in (1, 2)]
    policy = lambda: RandomPolicy(("Left", "Down", "Right", "Up"), "no_think", seed=3)  # noqa: E731
    remote = rollout(specs, policy(), SamplingConfig(max_new_tokens=32), max_turns=6,
                     env_factory=remote_spec_factory(server.url))
    local = rollout(specs, policy(), SamplingConfig(max_new_tokens=32), max_turns=6)
    assert [e.error for e in remote] == [None, None]
    assert [[t.reward for t in e.turns] for e in remote] == [[t.reward for t in e.turns] for e in local]
    assert [[t.observation.text for t in e.turns] for e in remote] == [[t.observation.text for t in e.turns] for e in local]


def test_slow_env_does_not_block_the_loop_and_one_session_serializes(server):
    slow = RemoteEnv(server.url, "svc_toy", format="no_think", slow_seconds=1.0)
    other = RemoteEnv(server.url, "svc_toy", format="no_think")
    slow.reset(0), other.reset(0)
    t = threading.Thread(target=slow.step, args=("__slow__",))
    t0 = time.monotonic()
    t.start()
    time.sleep(0.15)
    h0 = time.monotonic()
    assert httpx.get(server.url + "/health", timeout=5).status_code == 200
    other.step("<answer>Left</answer>")
    assert time.monotonic() - h0 < 0.6, "the event loop (or the other session) waited for the slow step"
    # a second call on the slow session waits for the first (per-session lock)
    r = httpx.get(f"{server.url}/v1/sessions/{slow.session_id}/state", timeout=5)
    assert r.status_code == 200 and time.monotonic() - t0 >= 0.95
    t.join()
    slow.close(), other.close()


def test_step_retry_with_the_same_index_is_applied_once(server):
    env = RemoteEnv(server.url, "svc_toy", format="no_think")
    env.reset(9)
    url = f"{server.url}/v1/sessions/{env.session_id}/step"
    a = httpx.post(url, json={"response": "<answer>Right</answer>", "index": 0})
    b = httpx.post(url, json={"response": "<answer>Right</answer>", "index": 0})
    assert a.status_code == b.status_code == 200 and a.content == b.content
    assert env.state()["position"] == local_transcript("svc_toy", {"format": "no_think"}, 9,
                                                        ["<answer>Right</answer>"])[1][5]["position"]
    c = httpx.post(url, json={"response": "<answer>Right</answer>", "index": 5})
    assert c.status_code == 409 and c.json()["error"] == "OutOfOrder"
    env.close()
