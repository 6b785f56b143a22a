"""What frames an RL step and outlives it: the rollout set-up starts on entering ``StepLoop`` and
is closed when the set-up fails after it; the remote envs' connection pools are closed with the
loop; the loop takes every configuration's episodes from the one rollout object (the driver's
``get``, on the default path too); a sharded module's FSDP root goes with the module."""

from __future__ import annotations

import gc
import weakref
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

import vagent.recipes.step as step_module
import vagent.rollout.driver as driver_module
from vagent.distributed.fsdp import ShardedRoot, attach_root, root_of
from vagent.runconfig import load_config
from vagent.rollout.driver import RolloutDriver, close_env_factories
from vagent.rollout.policy import Reply, SamplingConfig
from vagent.rollout.specs import sampling_for, train_env_specs
from vagent.rollout.loop import LastCheckpoint, TrainRollout
from vagent.rollout.trajectory import turn_seed
from vagent.runs.errors import NonFiniteError
from vagent.service.client import Transport


class _ClosingDriver(RolloutDriver):
    """A real driver (default path) that records its close."""

    closed = 0

    def close(self) -> None:
        type(self).closed += 1
        super().close()


def test_step_loop_starts_rollouts_on_entry_and_closes_them_when_the_setup_fails(monkeypatch):
    started = []

    def start_rollouts(session, reasoning, last_checkpoint, first_step=0):
        started.append(session)
        return None, _ClosingDriver(lambda policy, step, unshard: [], policy=None)

    def no_bar(*args, **kwargs):
        raise OSError("the terminal went away")

    pool = Transport("http://127.0.0.1:9")  # a remote env entry's connection pool (nothing is sent)
    monkeypatch.setitem(driver_module._FACTORIES, ("http://127.0.0.1:9",), SimpleNamespace(transport=pool))
    monkeypatch.setattr(step_module, "start_rollouts", start_rollouts)
    monkeypatch.setattr(step_module, "StepProgress", no_bar)
    _ClosingDriver.closed = 0
    session = _session(load_config(None, []))
    loop = step_module.StepLoop(session, 0)
    assert started == []  # building the frame starts nothing: a failure before `with` leaks nothing
    with pytest.raises(OSError, match="terminal"):
        with loop:
            pass
    assert started == [session] and _ClosingDriver.closed == 1  # started on entry, closed when entry failed
    assert not pool.http.closed  # the pools live until the loop ran and ended
    close_env_factories()
    assert pool.http.closed and not driver_module._FACTORIES


def test_step_loop_exit_closes_the_driver_and_the_env_pools(monkeypatch):
    pool = Transport("http://127.0.0.1:9")
    monkeypatch.setitem(driver_module._FACTORIES, ("http://127.0.0.1:9",), SimpleNamespace(transport=pool))
    monkeypatch.setattr(step_module, "start_rollouts",
                        lambda session, reasoning, last, first_step=0: (None, _ClosingDriver(lambda policy, step, unshard: [],
                                                                               policy=None)))
    _ClosingDriver.closed = 0
    with step_module.StepLoop(_session(load_config(None, ["log.progress=false"])), 0) as loop:
        assert isinstance(loop.driver, _ClosingDriver)
    assert _ClosingDriver.closed == 1 and pool.http.closed and not driver_module._FACTORIES


def _session(cfg):
    """The parts of a Session that the loop's frame reads."""
    encoder = SimpleNamespace(pad_token_id=0, image_token_id=None)
    return SimpleNamespace(cfg=cfg, console=None, reasoning_reward=lambda: None, loaded=SimpleNamespace(encoder=encoder),
                           device=torch.device("cpu"))


class _Recording:
    """A scripted policy that records how many conversations each call answered and with what
    sampling; ``fail`` makes it raise what a sampler raises on non-finite probabilities."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, SamplingConfig]] = []
        self.fail = False

    def act(self, conversations, sampling):
        if self.fail:
            raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")
        self.calls.append((len(conversations), sampling))
        return [Reply(text="<answer>Left</answer>", finish_reason="stop") for _ in conversations]


def test_the_default_rollout_runs_through_the_driver_and_adds_no_metric():
    """The default configuration (in process, lockstep, no overlap) builds the one rollout object
    too: ``make_driver`` builds the run's ``TrainRollout`` and ``StepLoop.rollout`` is the driver's
    ``get``: step 4's train envs and sampling, played with the loop's own policy on the trainer's
    model (``unshard``), its episodes back as they were made with no ``rollout/weights_*`` metric; a
    policy whose weights went non-finite is named with the loop's newest checkpoint."""
    cfg = load_config(None, ["log.progress=false", "envs.0.n_train=2", "rollout.max_turns=1"])
    policy, model, last = _Recording(), torch.nn.Linear(2, 2), LastCheckpoint("ck/rl_000002")
    from vagent.rollout.make_driver import make_driver

    driver = make_driver(cfg, SimpleNamespace(model=model), policy, None, last)
    loop = step_module.StepLoop(_session(cfg), 3)
    loop.driver = driver
    assert isinstance(driver.run, TrainRollout) and driver.policy is policy and driver.unshard
    got = loop.rollout(3)
    assert [e.seed for e in got] == [spec.seed for spec in train_env_specs(cfg, 3)]
    base = sampling_for(cfg, 3)
    assert policy.calls == [(2, replace(base, seed=turn_seed(base.seed, 0)))]
    assert "rollout/success_rate" in got.metrics and not any(k.startswith("rollout/weights_") for k in got.metrics)
    assert driver.in_flight() is None
    last.path = "ck/rl_000003"  # the loop wrote a checkpoint after the driver was built
    with torch.no_grad():
        model.weight[0, 0] = float("nan")
    policy.fail = True
    with pytest.raises(NonFiniteError, match=r"policy weights \(weight\) became nan at rl step 4.*ck/rl_000003"):
        loop.rollout(4)
    driver.close()


def test_a_sharded_module_is_not_kept_alive_by_its_root():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    head = torch.nn.Linear(4, 1)  # a module that runs under the model's root (a shared critic's head)
    root = ShardedRoot(model)
    attach_root([model, head], root)
    assert root_of(model) is root and root_of(head) is root and root_of(torch.nn.Linear(1, 1)) is None
    assert not any(isinstance(m, ShardedRoot) for m in model.modules())  # not a submodule of the model
    assert set(model.state_dict()) == {"0.weight", "0.bias"}
    gone = weakref.ref(model), weakref.ref(root)
    del model, root
    gc.collect()
    assert gone[0]() is not None  # the head runs under the root, and the root holds the model
    del head
    gc.collect()
    assert gone[0]() is None and gone[1]() is None  # nothing else kept them
