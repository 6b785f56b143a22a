"""The asynchronous schedule: each trajectory advances on its own reply and env step, and the
episodes equal the lockstep rollout's, episode for episode (tiny VLM on FrozenLake)."""

from __future__ import annotations

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
    """Odd seeds step in 0.3 s: the even ones finish their turns before the odd ones' first step ends."""
    def factory(spec):
        return SlowEnv(make(spec.name, **dict(spec.config)), 0.3 if spec.seed % 2 else 0.0)

    done_at = {}
    policy = HFPolicy(loaded, batching=True)
    real_act = policy.act

    def act(convs, sampling):
        out = real_act(convs, sampling)
        done_at.setdefault(convs[0].key, []).append(time.perf_counter())
        return out

    policy.act = act
    got = rollout(specs(2), policy, GREEDY, max_turns=3, env_factory=factory, schedule="async")
    policy.engine.close()
    fast, slow = got[0], got[1]
    if len(fast.turns) == 3 and len(slow.turns) >= 2:
        assert done_at[0][-1] < done_at[1][1]  # the fast one's 3rd reply came before the slow one's 2nd


def test_async_needs_a_thread_safe_policy_and_per_request_seeds(loaded):
    with pytest.raises(TypeError, match="batching=True"):
        rollout(specs(1), ScriptedPolicy(lambda c: "<answer>Left</answer>"), GREEDY, max_turns=1, schedule="async")
    with pytest.raises(ValueError, match="per_request_seeds"):
        rollout(specs(1), HFPolicy(BatchingEngine(HFEngine(loaded.model, loaded.encoder))), SAMPLED, max_turns=1,
                schedule="async")
    with pytest.raises(ValueError, match="schedule"):
        rollout(specs(1), HFPolicy(loaded), GREEDY, max_turns=1, schedule="later")
