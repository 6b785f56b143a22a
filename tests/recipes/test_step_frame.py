"""What frames an RL step and outlives it: the rollout set-up starts on entering ``StepLoop`` and
is closed when the set-up fails after it; the remote envs' connection pools are closed with the
loop; a sharded module's FSDP root goes with the module; the critic's explained variance is the
whole batch's (no micro-batch computes one)."""

from __future__ import annotations

import gc
import weakref
from types import SimpleNamespace

import pytest
import torch

import vagent.recipes.step as step_module
import vagent.rollout.driver as driver_module
from vagent.distributed.fsdp import ShardedRoot, attach_root, root_of
from vagent.recipes.config import load_config
from vagent.rl.losses import value_loss
from vagent.rollout.driver import RolloutDriver, close_env_factories
from vagent.service.client import Transport


class _ClosingDriver(RolloutDriver):
    """A real driver (default path) that records its close."""

    closed = 0

    def close(self) -> None:
        type(self).closed += 1
        super().close()


def test_step_loop_starts_rollouts_on_entry_and_closes_them_when_the_setup_fails(monkeypatch):
    started = []

    def start_rollouts(session, reasoning):
        started.append(session)
        return None, _ClosingDriver(lambda policy, step, unshard: [], policy=None)

    def no_bar(*args, **kwargs):
        raise OSError("the terminal went away")

    pool = Transport("http://127.0.0.1:9")  # a remote env entry's connection pool (nothing is sent)
    monkeypatch.setitem(driver_module._FACTORIES, ("http://127.0.0.1:9",), SimpleNamespace(transport=pool))
    monkeypatch.setattr(step_module, "start_rollouts", start_rollouts)
    monkeypatch.setattr(step_module, "StepProgress", no_bar)
    _ClosingDriver.closed = 0
    session = SimpleNamespace(cfg=load_config(None, []), console=None, reasoning_reward=lambda: None)
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
                        lambda session, reasoning: (None, _ClosingDriver(lambda policy, step, unshard: [], policy=None)))
    _ClosingDriver.closed = 0
    session = SimpleNamespace(cfg=load_config(None, ["log.progress=false"]), console=None,
                              reasoning_reward=lambda: None)
    with step_module.StepLoop(session, 0) as loop:
        assert isinstance(loop.driver, _ClosingDriver)
    assert _ClosingDriver.closed == 1 and pool.http.closed and not driver_module._FACTORIES


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


def test_the_value_loss_of_a_micro_batch_leaves_explained_variance_to_the_batch():
    g = torch.Generator().manual_seed(0)
    values, old, returns = (torch.randn(3, 5, generator=g) for _ in range(3))
    mask = torch.ones(3, 5, dtype=torch.bool)
    full = value_loss(values, old, returns, mask)
    part = value_loss(values, old, returns, mask, with_explained_variance=False)
    assert part.explained_variance is None and "loss/explained_variance" not in part.metrics()
    assert torch.equal(part.loss, full.loss)
    assert {k: v for k, v in full.metrics().items() if k != "loss/explained_variance"} == part.metrics()
