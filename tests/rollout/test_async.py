"""The asynchronous schedule: each trajectory advances on its own reply and env step, and the
episodes equal the lockstep rollout's, episode for episode (tiny VLM on FrozenLake)."""

from __future__ import annotations

import threading
import time

import pytest

from vagent.envs import make
from vagent.models.batching import BatchingEngine
from vagent.models.engine import HFEngine
from vagent.rollout import EnvSpec, HFPolicy, SamplingConfig, ScriptedPolicy, rollout

GREEDY = SamplingConfig(temperature=0.0, max_new_tokens=12)
SAMPLED = SamplingConfig(temperature=1.0, max_new_tokens=12, seed=11)
CFG = {"format": "free_think", "max_steps": 20}


class SlowEnv:
    """A real FrozenLake whose steps take ``delay`` seconds (envs of unequal latency)."""

    def __init__(self, env, delay):
        self.env, self.delay = env, delay

    def step(self, text):
        time.sleep(self.delay)
        return self.env.step(text)

    def __getattr__(self, name):
        return getattr(self.env, name)


def slow_factory(spec):
    return SlowEnv(make(spec.name, **dict(spec.config)), 0.05 if spec.seed % 2 else 0.0)


def specs(n=4):
    return [EnvSpec("frozenlake", CFG, seed) for seed in range(n)]


def summary(episodes):
    """What must match: ids, rewards, states, parses, ends, errors, the training samples."""
    return [(e.traj_id, e.error, e.terminated, e.truncated,
             [(t.sampled_token_ids, t.reward, t.state_before, t.state_after, t.parsed, t.prompt_token_ids)
              for t in e.turns],
             [[s.input_ids for s in conv.segments] for conv in e.samples]) for e in episodes]


@pytest.mark.parametrize("mode,window", [("concat", None), ("no_concat", None), ("concat", 1)])
def test_async_equals_lockstep_greedy(loaded, mode, window):
    lock = rollout(specs(), HFPolicy(loaded), GREEDY, max_turns=3, mode=mode, window=window,
                   env_factory=slow_factory)
    policy = HFPolicy(loaded, batching=True)
    got = rollout(specs(), policy, GREEDY, max_turns=3, mode=mode, window=window, env_factory=slow_factory,
                  schedule="async")
    assert summary(got) == summary(lock)
    assert sum(len(e.turns) for e in got) >= 8
    # replies were batched: fewer engine calls than replies
    assert policy.engine.stats["batches"] < policy.engine.stats["requests"]
    policy.engine.close()


def test_async_sampling_with_per_request_seeds_equals_lockstep(loaded):
    lock = rollout(specs(), HFPolicy(loaded, per_request_seeds=True), SAMPLED, max_turns=3, env_factory=slow_factory)
    policy = HFPolicy(loaded, per_request_seeds=True, batching=True)
    got = rollout(specs(), policy, SAMPLED, max_turns=3, env_factory=slow_factory, schedule="async")
    assert summary(got) == summary(lock)
    policy.engine.close()


def test_fast_trajectories_do_not_wait_for_slow_ones(loaded):
    """The odd seed's first env step blocks until the even seed's trajectory has ended. Only a
    schedule without a per-turn barrier can end the fast trajectory while the slow one is stuck in
    its step; lockstep would wait for that step, and the gate gives up after 120 s (no timing
    thresholds: the order of events decides, whatever the machine's load)."""
    fast_done = threading.Event()
    gate_opened = []

    class Gated:
        def __init__(self, env, slow):
            self.env, self.slow, self.steps = env, slow, 0

        def step(self, text):
            if self.slow and not gate_opened:
                gate_opened.append(fast_done.wait(timeout=120))
            result = self.env.step(text)
            self.steps += 1
            if not self.slow and (result.terminated or result.truncated or self.steps == 3):
                fast_done.set()
            return result

        def __getattr__(self, name):
            return getattr(self.env, name)

    policy = HFPolicy(loaded, batching=True)
    got = rollout(specs(2), policy, GREEDY, max_turns=3, env_factory=lambda spec: Gated(
        make(spec.name, **dict(spec.config)), slow=bool(spec.seed % 2)), schedule="async")
    policy.engine.close()
    assert gate_opened == [True], "the fast trajectory did not end while the slow one's first step was blocked"
    assert not got[0].error and not got[1].error and len(got[1].turns) >= 1


def test_async_needs_a_thread_safe_policy_and_per_request_seeds(loaded):
    with pytest.raises(TypeError, match="batching=True"):
        rollout(specs(1), ScriptedPolicy(lambda c: "<answer>Left</answer>"), GREEDY, max_turns=1, schedule="async")
    with pytest.raises(ValueError, match="per_request_seeds"):
        rollout(specs(1), HFPolicy(BatchingEngine(HFEngine(loaded.model, loaded.encoder))), SAMPLED, max_turns=1,
                schedule="async")
    with pytest.raises(ValueError, match="schedule"):
        rollout(specs(1), HFPolicy(loaded), GREEDY, max_turns=1, schedule="later")
