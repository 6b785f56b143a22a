"""Weights versions of a replica whose pushes land while other threads generate on it (the
streaming rollout): every reply is stamped with the version of the weights that produced it.

An ``EngineReplica`` (the body of the Ray actor, built in this process) serves greedy replies to
four threads that call ``generate`` in a loop, while the main thread pushes two visibly different
weight sets in turn (A, then a perturbed copy B, as versions 1, 2, 3, 4: odd versions hold B). Each
reply must equal the reply its stamped version's weights give (computed beforehand with an
``HFEngine`` per weight set). A stamp read before the call queues for its batch (a push may load
between the two) fails this.
"""

from __future__ import annotations

import copy
import threading
import time

import pytest
import torch

from vagent.models.engine import GenerationRequest, HFEngine, SamplingParams
from vagent.models.remote import EngineReplica

GREEDY = SamplingParams(do_sample=False, max_new_tokens=8)
PROMPTS = ("The goal is below and to the right of you.", "Move left.", "Where is the box?",
           "Push the box onto the target, then stop.", "Up, up, down.")
THREADS = 4
PUSHES = 4
#: replies each thread must receive after a push before the next one (generation keeps running)
CALLS_BETWEEN_PUSHES = 3
#: bound on any wait here (a stalled replica fails the test instead of hanging the suite)
WAIT_S = 60.0


def perturbed(model: torch.nn.Module, scale: float = 0.05, seed: int = 1) -> torch.nn.Module:
    out = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in out.parameters():
            p.add_(scale * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return out


def requests(encoder) -> list[GenerationRequest]:
    return [GenerationRequest(list(encoder.tokenizer(text)["input_ids"])) for text in PROMPTS]


def references(model: torch.nn.Module, encoder, reqs: list[GenerationRequest]) -> list[list[int]]:
    """Each prompt's greedy reply with ``model``'s weights, one request per call."""
    engine = HFEngine(model, encoder)
    return [engine.generate([r], GREEDY)[0].token_ids for r in reqs]


def test_every_reply_carries_the_version_of_the_weights_that_produced_it(tiny_vlm):
    weights_a = copy.deepcopy(tiny_vlm.model).eval()
    weights_b = perturbed(weights_a).eval()
    reqs = requests(tiny_vlm.encoder)
    want = [references(weights_a, tiny_vlm.encoder, reqs), references(weights_b, tiny_vlm.encoder, reqs)]
    assert all(a != b for a, b in zip(*want)), "the perturbed weights must change every greedy reply"
    states = [{k: v.clone() for k, v in m.state_dict().items()} for m in (weights_a, weights_b)]

    replica = EngineReplica(copy.deepcopy(weights_a), tiny_vlm.encoder)
    stop = threading.Event()
    got: list[list[tuple[int, list[int], int | None]]] = [[] for _ in range(THREADS)]
    errors: list[BaseException] = []

    def generate_in_a_loop(t: int) -> None:
        try:
            i = t
            while not stop.is_set():
                out = replica.generate([reqs[i % len(reqs)]], GREEDY)[0]
                got[t].append((i % len(reqs), out.token_ids, out.weights_version))
                i += 1
        except BaseException as exc:  # noqa: BLE001 -- re-raised by the main thread
            errors.append(exc)

    def wait_for_calls(n: int) -> None:
        """Until every thread has received ``n`` more replies."""
        start = [len(g) for g in got]
        deadline = time.monotonic() + WAIT_S
        while any(len(g) - s < n for g, s in zip(got, start)):
            assert not errors, errors
            assert time.monotonic() < deadline, f"the generating threads stalled: {[len(g) for g in got]}"
            time.sleep(0.002)

    threads = [threading.Thread(target=generate_in_a_loop, args=(t,), daemon=True) for t in range(THREADS)]
    for th in threads:
        th.start()
    try:
        wait_for_calls(CALLS_BETWEEN_PUSHES)
        for version in range(1, PUSHES + 1):
            t0 = time.monotonic()
            assert replica.load_weights(states[version % 2], version) == version
            assert time.monotonic() - t0 < WAIT_S, "the push waited too long for the generate calls"
            wait_for_calls(CALLS_BETWEEN_PUSHES)
    finally:
        stop.set()
        for th in threads:
            th.join(timeout=WAIT_S)
    assert not errors, errors

    replies = [r for g in got for r in g]
    wrong = [(p, v, ids) for p, ids, v in replies if v is None or ids != want[v % 2][p]]
    assert not wrong, (f"{len(wrong)} of {len(replies)} replies were not produced by the weights of the version "
                       f"they carry (prompt, stamped version, ids): {wrong[:3]}")
    assert {v for _, _, v in replies} == set(range(PUSHES + 1))
    assert replica.stats()["version"] == PUSHES


def test_a_waiting_push_goes_before_new_generate_calls():
    """Writer preference: while a push waits for a running generate call, a new generate call
    waits for the push (a stream of calls cannot starve it)."""
    from vagent.models.replica_actors import PushGate

    gate = PushGate()
    order: list[str] = []
    running, release = threading.Event(), threading.Event()

    def long_generate() -> None:
        with gate.generating():
            running.set()
            release.wait(WAIT_S)
            order.append("first generate")

    def push() -> None:
        with gate.pushing():
            order.append("push")

    def late_generate() -> None:
        with gate.generating():
            order.append("late generate")

    first = threading.Thread(target=long_generate)
    first.start()
    assert running.wait(WAIT_S)
    pusher = threading.Thread(target=push)
    pusher.start()
    deadline = time.monotonic() + WAIT_S
    while not gate.pushes_waiting:  # the push is queued behind the running call
        assert time.monotonic() < deadline
        time.sleep(0.001)
    late = threading.Thread(target=late_generate)
    late.start()
    time.sleep(0.1)
    assert order == []  # the push waits for the running call; the late call waits for the push
    release.set()
    for th in (first, pusher, late):
        th.join(WAIT_S)
    assert order == ["first generate", "push", "late generate"]


@pytest.mark.parametrize("method", ["generating", "pushing"])
def test_the_gate_is_released_when_the_call_raises(method):
    from vagent.models.replica_actors import PushGate

    gate = PushGate()
    with pytest.raises(RuntimeError):
        with getattr(gate, method)():
            raise RuntimeError("the engine failed")
    done = threading.Event()

    def both() -> None:
        with gate.pushing():
            pass
        with gate.generating():
            done.set()

    threading.Thread(target=both, daemon=True).start()
    assert done.wait(WAIT_S)


def test_a_replica_freezes_what_its_set_up_made(tiny_vlm):
    """A Ray actor's imports run while Ray unpickles its model, outside vagent's control: the
    replica freezes everything alive once it is built (vagent/startup.py), so that the collector's
    full collections skip torch's and transformers' objects for the actor's whole life."""
    import gc

    frozen = gc.get_freeze_count()
    EngineReplica(copy.deepcopy(tiny_vlm.model), tiny_vlm.encoder)  # its model copy: new objects
    assert gc.get_freeze_count() > frozen


# a Ray actor's start, in a fresh process: Ray imports the actor's class (vagent.models.replica_actors,
# which loads no torch), unpickles its arguments (here: the Deferred model and encoder, which import
# nothing more), then calls __init__; a generate call's request is unpickled after it. Full collections
# (generation 2) are recorded with whether torch was loaded and how many objects were frozen then
ACTOR_START = """
import gc, pickle, sys
full = []
gc.callbacks.append(lambda phase, info: phase == "start" and info["generation"] == 2
                    and full.append(("torch" in sys.modules, gc.get_freeze_count())))
from vagent.models.replica_actors import EngineReplica
with open(sys.argv[1], "rb") as f:
    model, encoder = pickle.load(f)
assert "torch" not in sys.modules, "the actor's class module or its Deferred arguments imported torch"
replica = EngineReplica(model, encoder)
from vagent.models.generation import SamplingParams
with open(sys.argv[2], "rb") as f:
    request = pickle.load(f)
print("REPLY", replica.generate([request], SamplingParams(do_sample=False, max_new_tokens=8))[0].token_ids)
print("GCPROBE", gc.get_freeze_count(), full)
"""


def test_a_replica_unpickles_its_model_itself_with_the_collector_off(tiny_vlm, tmp_path):
    """``RemoteEngine`` hands each replica actor its model and encoder as ``Deferred`` arguments: the
    actor unpickles them inside ``heavy_imports`` (vagent/startup.py), so no full collection walks
    torch's or transformers' objects during its start, and it serves what the model in this process serves."""
    import pickle
    import subprocess
    import sys

    from ray import cloudpickle

    from vagent.models.replica_actors import Deferred

    request = requests(tiny_vlm.encoder)[0]
    want = references(tiny_vlm.model, tiny_vlm.encoder, [request])[0]
    args, call = tmp_path / "args.pkl", tmp_path / "call.pkl"
    args.write_bytes(cloudpickle.dumps((Deferred(copy.deepcopy(tiny_vlm.model)), Deferred(tiny_vlm.encoder))))
    call.write_bytes(pickle.dumps(request))
    assert isinstance(pickle.loads(args.read_bytes())[0], Deferred)
    run = subprocess.run([sys.executable, "-c", ACTOR_START, str(args), str(call)], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in run.stdout.splitlines() if line.startswith(("REPLY", "GCPROBE")))
    assert lines["REPLY"] == str(want)
    frozen, full = lines["GCPROBE"].split(" ", 1)
    assert int(frozen) > 200_000, lines["GCPROBE"]
    assert "(True, 0)" not in full, f"a full collection walked torch's objects before they were frozen: {lines['GCPROBE']}"
