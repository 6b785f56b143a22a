"""``rollout.interrupt`` on vLLM (vLLM's CPU build; marker ``vllm``): ``VLLMEngine`` with an
``interrupt`` callable steps vLLM's engine itself (``vagent.models.vllm_stepping``), stops the
unfinished replies when it answers True, returns each with finish reason ``"interrupted"``, the
ids so far and their log-probs, and ``continue_interrupted`` joins it to a full reply; a
``VLLMReplica`` built with ``interrupt`` lets a push land while a long reply runs.

One in-process ``VLLMReplica`` (no Ray) for the module: its ``VLLMEngine`` serves the engine tests.
"""

from __future__ import annotations

import threading
import time

import pytest
import torch

from tests.models.conftest import interrupt_after, random_images
from tests.vllm_tiny import build_vllm_tiny
from vagent.models.engine import INTERRUPTED, GenerationRequest, SamplingParams
from vagent.models.interrupt import continue_interrupted

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

GREEDY = SamplingParams(do_sample=False, max_new_tokens=24)
SAMPLED = SamplingParams(do_sample=True, temperature=1.0, max_new_tokens=48)
ENGINE_KW = dict(dtype="float32", kv_cache_memory_bytes=256 << 20, max_model_len=2048)


def _requests(encoder, seeds, text="Where is the goal? <image>"):
    out = []
    for s in seeds:
        images = random_images(1, size=(64, 64), seed=s)
        seg = encoder.encode_user(text, images)
        ids = list(encoder.encode_system("You are an agent.").input_ids) + list(seg.input_ids)
        out.append(GenerationRequest(ids, seg.pixel_values, seg.image_grid_thw, images=tuple(images), seed=100 + s,
                                     key=s))
    return out


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """(the loaded policy, an in-process VLLMReplica built with interrupt, its model directory)."""
    from vagent.models.loading import load_policy
    from vagent.models.replica_actors import VLLMReplica

    model_dir = build_vllm_tiny(tmp_path_factory.mktemp("vllm_interrupt") / "model")
    loaded = load_policy(model_dir)
    replica = VLLMReplica(str(model_dir), loaded.encoder, dict(ENGINE_KW), interrupt=True)
    assert replica.vllm.interrupt is not None and replica.vllm.interrupt() is False  # no push waits
    yield loaded, replica
    replica.close()


@pytest.fixture
def engine(setup):
    """The replica's VLLMEngine, its ``interrupt`` restored after the test."""
    engine = setup[1].vllm
    saved = engine.interrupt
    yield engine
    engine.interrupt = saved


@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_stepped_generation_equals_vllms_generate(setup, engine, params):
    loaded, _ = setup
    reqs = _requests(loaded.encoder, range(3))
    engine.interrupt = None  # LLM.generate
    want = engine.generate(reqs, params)
    engine.interrupt = lambda: False  # stepped, never stopped
    got = engine.generate(reqs, params)
    for a, b in zip(want, got, strict=True):
        assert (b.token_ids, b.logprobs, b.finish_reason, b.weights_version) == \
            (a.token_ids, a.logprobs, a.finish_reason, a.weights_version)


def test_an_interrupted_reply_has_the_tokens_so_far_and_continues_to_the_full_reply(setup, engine):
    loaded, _ = setup
    reqs = _requests(loaded.encoder, range(2))
    engine.interrupt = None
    full = {name: engine.generate(reqs, p) for name, p in (("greedy", GREEDY), ("sampled", SAMPLED))}
    assert all(len(o.token_ids) > 8 for outs in full.values() for o in outs), "replies too short for this test"
    for stop_at in (1, 6):
        engine.interrupt = interrupt_after(stop_at)
        cut = engine.generate(reqs, SAMPLED)
        for c, f in zip(cut, full["sampled"], strict=True):
            k = len(c.token_ids)
            assert c.finish_reason == INTERRUPTED and 0 < k < len(f.token_ids), (c.finish_reason, k)
            # the uninterrupted seeded run sampled the same tokens with the same log-probs
            assert c.token_ids == f.token_ids[:k] and c.logprobs == pytest.approx(f.logprobs[:k], abs=1e-6)
            assert c.weights_version == engine.weights_version and c.text == engine.decode(c.token_ids)
        engine.interrupt = interrupt_after(stop_at)
        head = engine.generate(reqs, GREEDY)
        assert all(o.finish_reason == INTERRUPTED for o in head)
        engine.interrupt = None
        out = continue_interrupted(engine.generate, reqs, GREEDY, head, loaded.encoder)
        for a, b in zip(out, full["greedy"], strict=True):
            assert (a.token_ids, a.finish_reason, a.text) == (b.token_ids, b.finish_reason, b.text)
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4) and a.token_versions is None
        print(f"stop at step {stop_at}: {[len(o.token_ids) for o in cut]} of "
              f"{[len(o.token_ids) for o in full['sampled']]} sampled tokens kept")


def test_a_push_stops_the_replicas_running_reply_which_continues_on_the_new_weights(setup):
    """A long sampled reply runs on the replica when a push of other weights arrives: the push
    does not wait for it; the reply's tokens before the push carry the old version, the
    continuation's the new one."""
    loaded, replica = setup
    params = SamplingParams(do_sample=True, temperature=1.0, max_new_tokens=1500)
    (request,) = _requests(loaded.encoder, [5])
    new = {k: v + 0.01 * torch.randn_like(v) if v.dim() >= 2 else v.clone()
           for k, v in loaded.model.state_dict().items()}
    version = replica.vllm.weights_version
    core = replica.vllm.llm.llm_engine
    box: dict = {}
    thread = threading.Thread(target=lambda: box.update(out=replica.generate([request], params)[0]))
    t_start = time.monotonic()
    thread.start()
    deadline = time.monotonic() + 120
    while not core.has_unfinished_requests():
        assert time.monotonic() < deadline, "the long reply did not start within 120 s"
        time.sleep(0.01)
    time.sleep(0.5)
    t0 = time.monotonic()
    replica.load_weights(new, version + 1)
    pushed_s = time.monotonic() - t0
    thread.join(timeout=600)
    reply_s = time.monotonic() - t_start
    head = box["out"]
    assert head.finish_reason == INTERRUPTED and 0 < len(head.token_ids) < params.max_new_tokens, head.finish_reason
    assert head.weights_version == version
    (out,) = continue_interrupted(replica.generate, [request], params, [head], loaded.encoder)
    split = len(head.token_ids)
    assert out.token_ids[:split] == head.token_ids and out.finish_reason in ("eos", "length")
    assert out.token_versions is not None and out.token_versions[:split] == [version] * split
    assert set(out.token_versions[split:]) == {version + 1} and len(out.token_versions) == len(out.token_ids)
    print(f"the push took {pushed_s:.2f} s; the reply was cut at token {split} of {params.max_new_tokens} "
          f"after {reply_s:.1f} s; joined: {len(out.token_ids)} tokens")
    assert pushed_s < 30
