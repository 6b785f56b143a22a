"""Replies stopped by a weight push and continued on the new weights (``rollout.interrupt``):
``HFEngine.interrupt`` stops between decode steps, ``continue_interrupted`` continues from the
tokens so far, and an engine replica stops its running replies when a push waits for it, so one
reply's tokens come from two weights versions, each with its own log-prob."""

from __future__ import annotations

import copy
import threading
import time

import pytest
import torch

from tests.models.conftest import interrupt_after
from vagent.models.engine import INTERRUPTED, GenerationRequest, HFEngine, SamplingParams
from vagent.models.interrupt import continue_interrupted, joined
from vagent.models.replica_actors import sequence_token_logprobs

GREEDY = SamplingParams(do_sample=False, max_new_tokens=10)


def _request(tiny_vlm, text: str = "The goal is below you. Where do you go?", **kw) -> GenerationRequest:
    return GenerationRequest(tiny_vlm.encoder.tokenizer(text)["input_ids"], **kw)


def test_the_engine_stops_between_decode_steps_with_the_tokens_so_far(tiny_vlm):
    engine = HFEngine(tiny_vlm.model, tiny_vlm.encoder)
    (full,) = engine.generate([_request(tiny_vlm)], GREEDY)
    assert len(full.token_ids) > 4, "the tiny model ended its reply too early for this test"
    engine.reset_cache()
    engine.interrupt = interrupt_after(3)
    (cut,) = engine.generate([_request(tiny_vlm)], GREEDY)
    assert cut.finish_reason == INTERRUPTED and cut.token_ids == full.token_ids[:3]
    assert cut.logprobs == pytest.approx(full.logprobs[:3], abs=1e-5)


def test_a_continued_reply_on_the_same_weights_equals_the_uninterrupted_one(tiny_vlm):
    engine = HFEngine(tiny_vlm.model, tiny_vlm.encoder)
    requests = [_request(tiny_vlm, key=0), _request(tiny_vlm, "You see a hole to your left.", key=1)]
    full = engine.generate(requests, GREEDY)
    for stop_at in (1, 4):
        engine.reset_cache()
        engine.interrupt = interrupt_after(stop_at)
        first = engine.generate(requests, GREEDY)
        assert any(o.finish_reason == INTERRUPTED for o in first), [o.finish_reason for o in first]
        assert all(len(o.token_ids) == stop_at for o in first if o.finish_reason == INTERRUPTED)
        engine.interrupt = None
        out = continue_interrupted(engine.generate, requests, GREEDY, first, tiny_vlm.encoder)
        for a, b in zip(out, full):
            assert (a.token_ids, a.finish_reason, a.text) == (b.token_ids, b.finish_reason, b.text)
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5) and a.token_versions is None


def test_the_seam_keeps_each_tokens_version_and_finds_the_end_again(tiny_vlm):
    from vagent.models.engine import GenerationOutput

    tok = tiny_vlm.encoder.tokenizer
    decode = lambda ids: tok.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)  # noqa: E731
    head_ids, tail_ids = tok("<answer>Le")["input_ids"], tok("ft</answer> and more")["input_ids"]
    head = GenerationOutput(head_ids, [-0.1] * len(head_ids), INTERRUPTED, decode(head_ids), 3)
    tail = GenerationOutput(tail_ids, [-0.2] * len(tail_ids), "length", decode(tail_ids), 4)
    params = SamplingParams(do_sample=False, max_new_tokens=64, stop_strings=("</answer>",))
    out = joined(head, tail, params, tiny_vlm.encoder.eos_token_ids, decode)
    assert out.finish_reason == "stop" and out.text.endswith("</answer>") and "more" not in out.text
    assert out.weights_version == 3 and out.token_versions[:len(head_ids)] == [3] * len(head_ids)
    assert set(out.token_versions[len(head_ids):]) == {4} and len(out.token_versions) == len(out.token_ids)


@pytest.mark.timeout(300)
def test_a_push_stops_a_replicas_running_reply_which_continues_on_the_new_weights(tiny_vlm, monkeypatch):
    """A real Ray replica built with ``interrupt``: a long sampled reply is running when a push of
    other weights arrives; the push does not wait for it, and the reply's tokens before the push
    carry version 0 and the old weights' log-probs, those after it version 1 and the new ones'."""
    pytest.importorskip("ray", reason="engine replicas need the ray extra")
    import shutil
    import tempfile

    from tests.models.test_weight_canary import trained
    from vagent.models.remote import RemoteEngine, start_ray

    root = tempfile.mkdtemp(prefix="vr-", dir="/tmp")
    monkeypatch.setenv("RAY_TMPDIR", root)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    ray = start_ray(num_cpus=1)
    old, new = copy.deepcopy(tiny_vlm.model), trained(tiny_vlm.model)
    engine = RemoteEngine(old, tiny_vlm.encoder, replicas=1, interrupt=True)
    params = SamplingParams(do_sample=True, temperature=1.0, max_new_tokens=400)
    request = _request(tiny_vlm, seed=7, key=0)
    try:
        engine.generate([_request(tiny_vlm)], GREEDY)  # the replica warmed up
        prefilled = engine.replica_stats()[0]["prompt_tokens"]
        box: dict = {}
        thread = threading.Thread(target=lambda: box.update(out=engine.generate([request], params)[0]))
        t_start = time.monotonic()
        thread.start()
        # the push must find the reply running: wait until the replica has started it (its prefill
        # counted; on a busy machine the call can take seconds to reach the actor), then some decode steps
        deadline = time.monotonic() + 120
        while engine.replica_stats()[0]["prompt_tokens"] == prefilled:
            assert time.monotonic() < deadline, "the long reply did not start on the replica within 120 s"
            time.sleep(0.02)
        time.sleep(0.3)
        t0 = time.monotonic()
        engine.update_weights(new)
        pushed_s = time.monotonic() - t0
        thread.join(timeout=240)
        out = box["out"]
    finally:
        engine.close()
        ray.shutdown()
        shutil.rmtree(root, ignore_errors=True)
    assert out.token_versions is not None, f"the reply ({len(out.token_ids)} tokens) ended before the push landed"
    split = out.token_versions.index(1)
    assert 0 < split < len(out.token_ids) and set(out.token_versions[split:]) == {1}, out.token_versions
    assert out.weights_version == 0 and out.finish_reason in ("eos", "length")
    ids, n = list(request.input_ids) + list(out.token_ids), len(request.input_ids)
    assert out.logprobs[:split] == pytest.approx(sequence_token_logprobs(old, ids, n)[:split], abs=1e-4)
    assert out.logprobs[split:] == pytest.approx(sequence_token_logprobs(new, ids, n)[split:], abs=1e-4)
    print(f"the push took {pushed_s:.2f} s; the reply split at token {split} of {len(out.token_ids)}; "
          f"the reply took {time.monotonic() - t_start:.1f} s")
    assert pushed_s < 30
