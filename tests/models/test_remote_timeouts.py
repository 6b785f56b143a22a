"""Deadlines of the calls to engine replicas (issue 59): a replica that is alive but stuck (a real
Ray actor whose ``generate``, ``load_weights``, ``logprobs``, ``stats`` or start blocks for an hour,
while it still answers its other calls) costs the caller ``rollout.generate_timeout_s`` or
``rollout.push_timeout_s``, not the run: the stuck replica is marked dead and killed, the other
replica serves every request (the same greedy tokens as the in-process engine), and with no
replica left the call raises one line naming each replica's fate and the setting to raise.

Each call runs in a thread that must end within its timeout plus ``MARGIN_S``, so a deadline
removed from ``vagent.models.remote`` fails the test instead of hanging the suite. The replicas are
attached by name (``RemoteEngine.attach``, as the other ranks of a job attach to rank 0's), which
is how a replica class of the test's own gets behind a ``RemoteEngine``.
"""

from __future__ import annotations

import copy
import threading
import time
import uuid
from typing import Any, Callable

import pytest
import torch

pytest.importorskip("ray", reason="RemoteEngine needs the ray extra: pip install 'vagent[ray]'")

from vagent.models.engine import GenerationRequest, HFEngine, SamplingParams  # noqa: E402
from vagent.models.remote import (  # noqa: E402
    NAMESPACE, EngineReplica, RemoteEngine, _cpu_copy, _replica_options, start_ray, sequence_token_logprobs,
)
from vagent.rollout import EnvSpec, HFPolicy, SamplingConfig, rollout  # noqa: E402

from tests.models.replica_kill import ids  # noqa: E402

GREEDY = SamplingConfig(temperature=0.0, max_new_tokens=12)
#: the deadline where a healthy replica must answer (a tiny model's batch on a busy 2-core machine)
TIMEOUT_S = 12.0
#: the deadline where no replica answers (every one is stuck): short, nothing has to run in time
SHORT_S = 4.0
#: how much longer than its deadline a timed-out call may take (Ray's kill, the retries, load)
MARGIN_S = 40.0
#: how long a stuck method blocks: far beyond every bound here (a removed deadline fails, not waits)
STUCK_S = 3600.0


class StuckReplica(EngineReplica):
    """An ``EngineReplica`` whose methods named in ``stuck`` (``__init__``, ``generate``,
    ``load_weights``, ``logprobs``, ``stats``) block for ``STUCK_S``; the others answer as usual."""

    def __init__(self, model: Any, encoder: Any, stuck: tuple[str, ...] = ()) -> None:
        self.stuck = stuck
        self._block("__init__")
        super().__init__(model, encoder)

    def _block(self, method: str) -> None:
        if method in self.stuck:
            time.sleep(STUCK_S)

    def generate(self, requests, params):
        self._block("generate")
        return super().generate(requests, params)

    def load_weights(self, state_dict, version):
        self._block("load_weights")
        return super().load_weights(state_dict, version)

    def logprobs(self, input_ids, n_prompt, temperature=1.0):
        self._block("logprobs")
        return super().logprobs(input_ids, n_prompt, temperature)

    def stats(self):
        self._block("stats")
        return super().stats()


@pytest.fixture(scope="module")
def ray_cluster():
    """A local cluster in a Ray temp folder of this module's own (as ``own_ray_temp``, for the module)."""
    import shutil
    import tempfile

    root = tempfile.mkdtemp(prefix="vr-", dir="/tmp")  # short: Ray's socket paths must fit in 107 bytes
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAY_TMPDIR", root)
        mp.delenv("RAY_ADDRESS", raising=False)
        ray = start_ray(num_cpus=2)
        yield ray
        ray.shutdown()
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture()
def replicas(ray_cluster, tiny_vlm):
    """``make(stuck_per_replica, push_s, generate_s)`` -> (a maker of the RemoteEngine attached to new
    named ``StuckReplica`` actors, their handles); every actor is killed after the test."""
    ray = ray_cluster
    made: list[Any] = []
    model_ref = ray.put(_cpu_copy(tiny_vlm.model))

    def make(stuck: list[tuple[str, ...]], push_s: float = TIMEOUT_S, generate_s: float = TIMEOUT_S,
             ) -> tuple[RemoteEngine, list[Any]]:
        names = [f"stuck-{uuid.uuid4().hex[:8]}-{i}" for i in range(len(stuck))]
        actor = ray.remote(StuckReplica)
        handles = [actor.options(num_cpus=0, max_concurrency=64, **kw).remote(model_ref, tiny_vlm.encoder, s)
                   for kw, s in zip(_replica_options(len(stuck), names), stuck)]
        made.extend(handles)
        # started before the clock of a test's deadline runs (a worker's start on a busy machine is slow)
        ray.get([h.ready.remote() for h, s in zip(handles, stuck) if "__init__" not in s], timeout=300)
        return lambda: RemoteEngine.attach(names, tiny_vlm.encoder, push_timeout_s=push_s,
                                           generate_timeout_s=generate_s), handles

    yield make
    for h in made:
        try:
            ray.kill(h, no_restart=True)
        except Exception:  # noqa: BLE001 -- gone already
            pass


def within(seconds: float, call: Callable[[], Any]) -> tuple[Any, BaseException | None, float]:
    """(result, raised exception, seconds taken) of ``call()`` run in a thread that must end within
    ``seconds``: a call that waits past it (a removed deadline) fails the test rather than hang it."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["result"] = call()
        except BaseException as exc:  # noqa: BLE001 -- handed to the test
            box["error"] = exc

    t0 = time.monotonic()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    took = time.monotonic() - t0
    assert not thread.is_alive(), f"the call still waits after {took:.0f} s (its deadline is gone?)"
    return box.get("result"), box.get("error"), took


def specs(n: int = 4) -> list[EnvSpec]:
    return [EnvSpec("frozenlake", {"format": "free_think", "max_steps": 20}, seed) for seed in range(n)]


def killed(ray: Any, handle: Any, within_s: float = 60.0) -> bool:
    """Whether the actor is gone (its process killed, so it holds nothing) within ``within_s``:
    ``ray.kill`` acts asynchronously, so a call sent right after it may still be answered."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            ray.get(handle.ready.remote(), timeout=10)
        except ray.exceptions.RayActorError:
            return True
        except ray.exceptions.GetTimeoutError:
            pass
        time.sleep(0.2)
    return False


def test_a_stuck_generate_times_out_and_the_other_replica_serves_every_request(replicas, ray_cluster, tiny_vlm):
    attach, handles = replicas([("generate",), ()])
    engine = attach()
    ref = rollout(specs(), HFPolicy(HFEngine(tiny_vlm.model, tiny_vlm.encoder)), GREEDY, max_turns=3)
    got, err, took = within(TIMEOUT_S + MARGIN_S, lambda: rollout(specs(), HFPolicy(engine), GREEDY, max_turns=3))
    assert err is None, err
    assert took >= TIMEOUT_S  # replica 0 had its share of the first turn, and was waited for
    assert engine.alive == [False, True]
    assert engine.stats["dead_replicas"] == 1 and engine.stats["retried_requests"] >= 1
    assert got.metrics["rollout/engine_retries"] >= 1
    assert got.metrics["rollout/errors"] == 0, [e.error[-1500:] for e in got if e.error]
    assert ids(got) == ids(ref)  # nothing lost: every trajectory finished on replica 1, token for token
    assert killed(ray_cluster, handles[0])


def test_a_stuck_push_marks_the_replica_dead_and_the_other_generates_with_the_new_weights(
        replicas, ray_cluster, tiny_vlm):
    attach, handles = replicas([("load_weights",), ()])
    engine = attach()
    trainer = copy.deepcopy(tiny_vlm.model)
    with torch.no_grad():
        for p in trainer.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=torch.Generator().manual_seed(0), dtype=p.dtype))
    version, err, took = within(TIMEOUT_S + MARGIN_S, lambda: engine.update_weights(trainer))
    assert err is None, err
    assert version == 1 and took >= TIMEOUT_S
    assert engine.alive == [False, True]
    assert killed(ray_cluster, handles[0])  # a replica with stale weights never answers again
    tokens = tiny_vlm.encoder.tokenizer("The goal is below and to the right of you.")["input_ids"]
    assert engine.replica_logprobs(1, tokens, 3) == pytest.approx(sequence_token_logprobs(trainer, tokens, 3), abs=1e-5)
    ref = rollout(specs(), HFPolicy(HFEngine(trainer, tiny_vlm.encoder)), GREEDY, max_turns=2)
    got, err, _ = within(TIMEOUT_S + MARGIN_S, lambda: rollout(specs(), HFPolicy(engine), GREEDY, max_turns=2))
    assert err is None, err
    assert ids(got) == ids(ref)
    assert {t.weights_version for e in got for t in e.turns} == {1}


@pytest.mark.parametrize("call", ["generate", "push"])
def test_every_replica_stuck_stops_with_one_line_naming_the_setting(replicas, ray_cluster, tiny_vlm, call):
    method, setting = ("generate", "rollout.generate_timeout_s") if call == "generate" else \
        ("load_weights", "rollout.push_timeout_s")
    attach, handles = replicas([(method,), (method,)], push_s=SHORT_S, generate_s=SHORT_S)
    engine = attach()
    if call == "generate":
        request = GenerationRequest(tiny_vlm.encoder.tokenizer("Hello")["input_ids"], key="t0")
        go = lambda: engine.generate([request, GenerationRequest(list(request.input_ids))],  # noqa: E731
                                     SamplingParams(do_sample=False, max_new_tokens=4))
    else:
        go = lambda: engine.update_weights(tiny_vlm.model)  # noqa: E731
    _, err, took = within(SHORT_S + MARGIN_S, go)
    from vagent.runs.errors import TrainingError

    assert isinstance(err, TrainingError), err  # the run prints it as one line, no traceback
    msg = str(err)
    assert "\n" not in msg and took >= SHORT_S
    assert msg.startswith("every engine replica is dead (replica 0 did not answer"), msg
    assert f"within {setting}=4 s (stuck; killed); replica 1 did not answer" in msg, msg
    assert msg.endswith(f"raise {setting} (seconds; docs/distributed.md, 'Timeouts of remote calls')."), msg
    assert engine.alive == [False, False]
    assert all(killed(ray_cluster, h) for h in handles)


def test_canary_and_stats_calls_time_out_with_one_line(replicas, ray_cluster, tiny_vlm):
    from vagent.runs.errors import TrainingError

    attach, handles = replicas([("stats",), ("logprobs",), ("generate",)], generate_s=SHORT_S)
    engine = attach()
    tokens = tiny_vlm.encoder.tokenizer("The goal is below you.")["input_ids"]
    calls = [("stats", engine.replica_stats),
             ("logprobs", lambda: engine.replica_logprobs(1, tokens, 3)),
             ("generate", lambda: engine.generate_on(2, [GenerationRequest(list(tokens))],
                                                     SamplingParams(do_sample=False, max_new_tokens=4)))]
    for i, (name, call) in enumerate(calls):
        _, err, took = within(SHORT_S + MARGIN_S, call)
        assert isinstance(err, TimeoutError) and isinstance(err, TrainingError), (name, err)  # a run: one line
        assert str(err).startswith(f"engine replica {i} (pid {engine.pids[i]}) did not answer {name} within "
                                   "rollout.generate_timeout_s=4 s (stuck; killed); if it is only slow, raise "
                                   "rollout.generate_timeout_s"), err
        assert took >= SHORT_S and engine.alive[i] is False
        assert killed(ray_cluster, handles[i])
    assert engine.replica_stats() == [None, None, None]


def test_a_replica_that_never_gets_ready_is_an_error_within_the_push_timeout(replicas):
    attach, _ = replicas([(), ("__init__",)], push_s=SHORT_S)
    _, err, took = within(SHORT_S + MARGIN_S, attach)
    from vagent.runs.errors import TrainingError

    assert isinstance(err, TimeoutError) and isinstance(err, TrainingError), err  # a run says it in one line
    assert str(err).startswith("engine replica 1 was not ready within rollout.push_timeout_s=4 s"), err
    assert str(err).endswith("raise rollout.push_timeout_s") and took >= SHORT_S


def test_the_canary_checks_the_live_replicas_when_one_is_lost_during_its_check(replicas, ray_cluster, tiny_vlm):
    """A replica stuck in the canary's generate is killed at ``generate_timeout_s`` and the check
    goes on with the other (the rollout routes around it as around any dead replica); with none
    left the check raises the timeout's line."""
    from vagent.rollout.canary import WeightCanary, build_probe

    probe, _ = build_probe(specs(2), tiny_vlm.encoder)
    trainer = copy.deepcopy(tiny_vlm.model)
    attach, handles = replicas([("generate",), ()], generate_s=SHORT_S)
    engine = attach()
    sync, err, took = within(SHORT_S + MARGIN_S, lambda: WeightCanary(probe, trainer, 0.01).check(engine, 0))
    assert err is None, err
    assert sync["sync/canary_max_abs_diff"] < 1e-4 and took >= SHORT_S, (sync, took)
    assert engine.alive == [False, True] and killed(ray_cluster, handles[0])

    attach, _ = replicas([("generate",)], generate_s=SHORT_S)
    lone = attach()
    _, err, _ = within(SHORT_S + MARGIN_S, lambda: WeightCanary(probe, trainer, 0.01).check(lone, 0))
    assert isinstance(err, TimeoutError) and "did not answer generate within rollout.generate_timeout_s=4 s" in str(err), err


def test_a_replica_that_dies_during_a_call_by_index_is_marked_dead_with_one_line(replicas, ray_cluster, tiny_vlm):
    attach, handles = replicas([(), ()])
    engine = attach()
    ray_cluster.kill(handles[0], no_restart=True)
    tokens = tiny_vlm.encoder.tokenizer("The goal is below you.")["input_ids"]
    from vagent.models.remote import ReplicaLost

    _, err, _ = within(MARGIN_S, lambda: engine.generate_on(0, [GenerationRequest(list(tokens))],
                                                            SamplingParams(do_sample=False, max_new_tokens=4)))
    from vagent.runs.errors import TrainingError

    assert isinstance(err, ReplicaLost) and isinstance(err, TrainingError), err  # a run says it in one line
    assert str(err).startswith(f"engine replica 0 (pid {engine.pids[0]}) died during generate: "), err
    assert engine.alive == [False, True]
