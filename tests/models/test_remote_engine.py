"""RemoteEngine: two HFEngine replicas as real Ray actors on a local cluster (one per module).

Same token ids as the in-process engine (greedy; seeded sampling with per-request seeds), a
replica's log-probs equal the trainer's after a weight push, and a replica killed mid-rollout
loses no episode (its requests finish on the other one, and the rollout reports it).
"""

from __future__ import annotations

import copy
import time

import pytest
import torch

pytest.importorskip("ray", reason="RemoteEngine needs the ray extra: pip install 'vagent[ray]'")

from vagent.models.engine import HFEngine  # noqa: E402
from vagent.models.remote import RemoteEngine, start_ray, sequence_token_logprobs  # noqa: E402
from vagent.rollout import EnvSpec, HFPolicy, SamplingConfig, rollout  # noqa: E402

from tests.models.replica_kill import check_killed_replica_loses_no_episode, ids  # noqa: E402

GREEDY = SamplingConfig(temperature=0.0, max_new_tokens=12)
SAMPLED = SamplingConfig(temperature=1.0, max_new_tokens=12, seed=7)


def specs(n=4):
    return [EnvSpec("frozenlake", {"format": "free_think", "max_steps": 20}, seed) for seed in range(n)]


@pytest.fixture(scope="module")
def ray_cluster():
    ray = start_ray(num_cpus=2)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def remote(ray_cluster, tiny_vlm):
    engine = RemoteEngine(tiny_vlm.model, tiny_vlm.encoder, replicas=2)
    yield engine
    engine.close()


def local_policy(loaded, **kw):
    return HFPolicy(HFEngine(loaded.model, loaded.encoder), **kw)


def test_greedy_ids_equal_in_process_and_turns_stay_on_one_replica(remote, tiny_vlm):
    ref = rollout(specs(), local_policy(tiny_vlm), GREEDY, max_turns=3)
    got = rollout(specs(), HFPolicy(remote), GREEDY, max_turns=3)
    assert ids(got) == ids(ref)
    assert sum(len(t) for t in ids(got)) >= 8
    assert all(t.weights_version == 0 for e in got for t in e.turns)
    assert got.metrics["rollout/engine_retries"] == 0
    served = [s["requests"] for s in remote.replica_stats()]
    assert all(n > 0 for n in served), served  # balanced over both replicas
    assert set(remote._home.values()) == {0, 1} and len(remote._home) == 4  # one home per trajectory


def test_seeded_sampling_with_per_request_seeds_equals_in_process(remote, tiny_vlm):
    ref = rollout(specs(), local_policy(tiny_vlm, per_request_seeds=True), SAMPLED, max_turns=3)
    got = rollout(specs(), HFPolicy(remote, per_request_seeds=True), SAMPLED, max_turns=3)
    assert ids(got) == ids(ref)
    # the async schedule on the replicas draws the same tokens
    got_async = rollout(specs(), HFPolicy(remote, per_request_seeds=True), SAMPLED, max_turns=3, schedule="async")
    assert ids(got_async) == ids(ref)


def test_replica_logprobs_equal_the_trainers_after_a_weight_push(remote, tiny_vlm):
    trainer = copy.deepcopy(tiny_vlm.model)
    with torch.no_grad():
        for p in trainer.parameters():
            p.add_(0.02 * torch.randn_like(p))
    tokens = tiny_vlm.encoder.tokenizer("The goal is below and to the right of you.")["input_ids"]
    before = remote.replica_logprobs(0, tokens, 3)
    assert before == pytest.approx(sequence_token_logprobs(tiny_vlm.model, tokens, 3), abs=1e-5)
    t0 = time.perf_counter()
    assert remote.update_weights(trainer) == 1
    push_s = time.perf_counter() - t0
    want = sequence_token_logprobs(trainer, tokens, 3)
    for replica in (0, 1):
        got = remote.replica_logprobs(replica, tokens, 3)
        assert got == pytest.approx(want, abs=1e-5), replica
        assert got != pytest.approx(before, abs=1e-3)
    out = rollout(specs(2), HFPolicy(remote), GREEDY, max_turns=1)
    assert {t.weights_version for e in out for t in e.turns} == {1}
    remote.update_weights(tiny_vlm.model)  # back to the shared weights (version 2) for the next test
    assert push_s < 30


def test_killed_replica_mid_rollout_loses_no_episode(remote, tiny_vlm):
    check_killed_replica_loses_no_episode(remote, local_policy(tiny_vlm), specs(6), GREEDY, wait_s=60)
