"""The check that a RemoteEngine whose replica 0 is killed mid-rollout loses no episode, shared by
the HF replicas' test (test_remote_engine.py) and the vLLM replicas' (test_vllm_replicas.py)."""

from __future__ import annotations

import threading
import time

from vagent.rollout import HFPolicy, rollout


def ids(episodes):
    return [[t.sampled_token_ids for t in e.turns] for e in episodes]


def check_killed_replica_loses_no_episode(engine, reference, specs, sampling, wait_s: float) -> None:
    """Roll ``specs`` out (3 turns) on ``engine`` (a 2-replica RemoteEngine) while a watcher kills
    replica 0 once a later turn's requests are on it (more than one turn's worth of requests served,
    replica 0 busy; within ``wait_s`` seconds): the token ids equal those of the ``reference``
    policy, the rollout counts the retries and no episode ends in an error."""
    ref = rollout(specs, reference, sampling, max_turns=3)
    n_before = engine.stats["requests"]
    killed = threading.Event()

    def kill_when_busy():
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if engine.stats["requests"] - n_before > len(specs) and engine._outstanding[0] > 0:
                engine.kill_replica(0)
                killed.set()
                return
            time.sleep(0.001)

    watcher = threading.Thread(target=kill_when_busy)
    watcher.start()
    got = rollout(specs, HFPolicy(engine), sampling, max_turns=3)
    watcher.join()
    assert killed.is_set()
    assert engine.alive == [False, True]
    assert got.metrics["rollout/engine_retries"] > 0  # the run says so
    assert got.metrics["rollout/errors"] == 0, [e.error[-1500:] for e in got if e.error]
    assert ids(got) == ids(ref)
