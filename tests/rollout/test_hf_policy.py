"""HFPolicy with the tiny random-weight Qwen2.5-VL on FrozenLake (vision): the real thing, end to end."""

from __future__ import annotations

import pytest
import torch

from vagent.models import HFEngine, forward_logits, token_logprobs
from vagent.rollout import EnvSpec, HFPolicy, SamplingConfig, rollout
from vagent.rollout.batch import build_token_batch

SAMPLED = SamplingConfig(temperature=1.0, max_new_tokens=12, seed=3)
GREEDY = SamplingConfig(temperature=0.0, max_new_tokens=12)


class RecordingEngine:
    """The real HFEngine, keeping every request it was asked to continue."""

    def __init__(self, engine):
        self.engine, self.encoder, self.requests = engine, engine.encoder, []

    def generate(self, requests, params):
        self.requests += [list(r.input_ids) for r in requests]
        return self.engine.generate(requests, params)


PLACEHOLDER_ERROR = "policy: sampled image/video placeholder token"


def check_errors(eps):
    """The random-weight model may sample <|image_pad|>: the only error allowed, and never all."""
    assert all(e.error is None or e.error.startswith(PLACEHOLDER_ERROR) for e in eps)
    assert sum(e.error is None for e in eps) >= len(eps) - 1


def specs(n=3):
    return [EnvSpec("frozenlake", {"format": "free_think", "max_steps": 20}, seed) for seed in range(n)]


@pytest.fixture(scope="module")
def runs(loaded):
    """One recorded rollout per context layout (shared by the tests of this module)."""
    out = {}
    for name, mode, window in [("concat", "concat", None), ("no_concat", "no_concat", None), ("window", "concat", 1)]:
        engine = RecordingEngine(HFEngine(loaded.model, loaded.encoder))
        eps = rollout(specs(), HFPolicy(engine), SAMPLED, max_turns=3, mode=mode, window=window)
        batch = build_token_batch(eps, mode=name, pad_token_id=loaded.encoder.pad_token_id)
        out[name] = (eps, batch, engine.requests)
    return out


@pytest.mark.parametrize("layout", ["concat", "no_concat", "window"])
def test_batch_holds_exactly_the_sampled_ids(runs, loaded, layout):
    eps, batch, _ = runs[layout]
    check_errors(eps)
    eps = [e for e in eps if e.error is None]
    sampled = [t.sampled_token_ids for e in eps for t in e.turns]
    if layout == "concat":
        rows = [batch.input_ids[b][batch.loss_mask[b]].tolist() for b in range(batch.batch_size)]
        assert rows == [[i for t in e.turns for i in t.sampled_token_ids] for e in eps]
    else:
        assert [batch.input_ids[b][batch.loss_mask[b]].tolist() for b in range(batch.batch_size)] == sampled
    assert all(len(s) >= 1 for s in sampled)
    # no decode/re-encode: the random model's replies often do not survive a text round trip,
    # and the batch still holds what was sampled
    tok = loaded.encoder.tokenizer
    reencoded = [tok(t.reply, add_special_tokens=False)["input_ids"] for e in eps for t in e.turns]
    assert any(r != s for r, s in zip(reencoded, sampled))


@pytest.mark.parametrize("layout", ["concat", "no_concat", "window"])
def test_training_context_equals_the_rollout_context(runs, layout):
    """Every generation request is a prefix of its row, followed by exactly the sampled ids."""
    eps, batch, requests = runs[layout]
    req = iter(requests)
    # requests come turn by turn over the active episodes: rebuild that order
    order = [(b, t) for t in range(3) for b, e in enumerate(eps) if t < len(e.turns) + (e.error is not None)]
    assert len(order) == len(requests)
    for e_idx, t in order:
        ep = eps[e_idx]
        request = next(req)
        if ep.error is not None:
            continue
        rows = [r for r in range(batch.batch_size) if batch.episode_index[r] == e_idx]
        row = rows[0] if layout == "concat" else rows[t]
        ids = batch.input_ids[row].tolist()
        assert ids[:len(request)] == request
        sampled = ep.turns[t].sampled_token_ids
        assert ids[len(request):len(request) + len(sampled)] == sampled
        assert batch.loss_mask[row, len(request):len(request) + len(sampled)].all()
        earlier = sum(len(x.sampled_token_ids) for x in ep.turns[:t]) if layout == "concat" else 0
        assert int(batch.loss_mask[row, :len(request)].sum()) == earlier


@pytest.mark.parametrize("layout", ["concat", "no_concat"])
def test_old_logprobs_line_up_with_a_training_forward(runs, loaded, layout):
    """The logprob stored at each sampled position is what a training forward pass computes there."""
    _, batch, _ = runs[layout]
    with torch.no_grad():
        logits = forward_logits(loaded.model, batch.input_ids, batch.attention_mask, batch.pixel_values,
                                batch.image_grid_thw)
    recomputed = token_logprobs(logits, batch.input_ids)
    m = batch.loss_mask
    assert torch.allclose(recomputed[m], batch.old_logprobs[m], atol=2e-3)
    # and the first sampled token of each row sits right after its generation prompt
    first = m.float().argmax(1)
    gen_prompt = loaded.encoder.encode_user("x").input_ids[-3:]
    for b in range(batch.batch_size):
        p = int(first[b])
        assert batch.input_ids[b, p - 3:p].tolist() == gen_prompt
        assert batch.old_logprobs[b, p] == pytest.approx(float(recomputed[b, p]), abs=2e-3)


def test_rollout_is_deterministic_given_seeds(loaded):
    def run(sampling):
        eps = rollout(specs(1), HFPolicy(loaded), sampling, max_turns=2, group_size=2)
        return [[t.sampled_token_ids for t in e.turns] for e in eps]

    greedy = run(GREEDY)
    assert greedy[0] == greedy[1]  # greedy group members are identical
    a = run(SAMPLED)
    assert a == run(SAMPLED)
    assert a[0] != a[1]  # sampled group members differ
    assert a != run(SamplingConfig(temperature=1.0, max_new_tokens=12, seed=4))


def test_context_limit_with_the_model(loaded):
    policy = HFPolicy(loaded, max_context_tokens=600)
    eps = rollout(specs(2), policy, GREEDY, max_turns=5)
    for ep in eps:
        assert ep.error is None
        assert ep.truncated or ep.terminated
        for conv in ep.samples:
            assert sum(len(s.input_ids) for s in conv.segments) <= 600
    assert any(ep.truncated and len(ep.turns) < 5 for ep in eps)


def test_constructor_errors(loaded):
    with pytest.raises(TypeError, match="not a bare torch module"):
        HFPolicy(loaded.model)
    with pytest.raises(ValueError, match="max_context_tokens"):
        HFPolicy(loaded, max_context_tokens=0)


class InjectingEngine:
    """The real HFEngine, with the image placeholder token appended to the first reply of a call
    (a random model can sample it; this makes it happen on demand)."""

    def __init__(self, engine):
        self.engine, self.encoder = engine, engine.encoder

    def generate(self, requests, params):
        outs = self.engine.generate(requests, params)
        outs[0].token_ids.append(self.encoder.image_token_id)
        outs[0].logprobs.append(-1.0)
        return outs


def test_a_sampled_image_placeholder_is_an_episode_error(loaded):
    policy = HFPolicy(InjectingEngine(HFEngine(loaded.model, loaded.encoder)))
    eps = rollout(specs(2), policy, GREEDY, max_turns=2)
    assert eps[0].error.startswith(PLACEHOLDER_ERROR) and not eps[0].turns
    assert eps[1].error is None or eps[1].error.startswith(PLACEHOLDER_ERROR)
    assert eps.metrics["rollout/errors"] >= 1


_SUBPROCESS_ROLLOUT = """
import json, sys, torch
torch.set_num_threads(1)
from vagent.models import load_policy
from vagent.rollout import EnvSpec, HFPolicy, SamplingConfig, rollout
specs = [EnvSpec("frozenlake", {"format": "free_think", "max_steps": 20}, 0)]
eps = rollout(specs, HFPolicy(load_policy(sys.argv[1])), SamplingConfig(temperature=1.0, max_new_tokens=12, seed=3),
              max_turns=2, group_size=2)
print(json.dumps([[t.sampled_token_ids for t in e.turns] for e in eps]))
"""


def test_a_seed_determines_the_episode_in_another_process(loaded, tiny_vlm_dir):
    import json
    import subprocess
    import sys

    eps = rollout(specs(1), HFPolicy(loaded), SAMPLED, max_turns=2, group_size=2)
    here = [[t.sampled_token_ids for t in e.turns] for e in eps]
    out = subprocess.run([sys.executable, "-c", _SUBPROCESS_ROLLOUT, str(tiny_vlm_dir)], capture_output=True,
                         text=True, timeout=300, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == here


def test_concat_turns_reuse_the_kv_cache_and_play_the_same_episodes(loaded):
    """HFEngine prefix reuse inside a real rollout: later turns take their history from the cache
    (perf/prompt_cache_frac > 0) and greedy episodes equal those of HF generate's full prefills."""
    specs3 = [EnvSpec("frozenlake", {"format": "free_think", "max_steps": 20}, seed) for seed in range(3)]
    cached = rollout(specs3, HFPolicy(loaded), GREEDY, max_turns=3)
    plain = rollout(specs3, HFPolicy(loaded, prefix_cache=False), GREEDY, max_turns=3)
    assert [[t.sampled_token_ids for t in e.turns] for e in cached] == [[t.sampled_token_ids for t in e.turns] for e in plain]
    assert any(len(e.turns) > 1 for e in cached)
    assert cached.metrics["perf/prompt_cache_frac"] > 0.2
    assert plain.metrics["perf/prompt_cache_frac"] == 0.0
