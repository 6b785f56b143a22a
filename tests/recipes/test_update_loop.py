"""The update loop (``vagent.recipes.update.Update``): the caller computes each micro-batch's loss
itself, so the loop must (1) give the same weights however the mini-batch is cut into
micro-batches (exact gradient accumulation) and (2) refuse a loop that skips a micro-batch's loss
or hands in another one's, instead of stepping the optimizer on a partial gradient."""

from __future__ import annotations

import pytest
import torch

from tests.rl.test_streaming_loss import PLAIN, _mixed, _model
from vagent.distributed import micro_batch_rows
from vagent.recipes.stages import Advantages, off_policy
from vagent.recipes.update import ACTOR, ActorInputs, Learner, Update, UpdateContext, actor_loss, actor_update
from vagent.runconfig import load_config


def _setup(micro_tokens: int):
    cfg = load_config(None, ["recipe=grpo", "rollout.group_size=2", *PLAIN, f"update.micro_batch_tokens={micro_tokens}"])
    model = _model()
    batch, scores, adv, _ = _mixed(cfg, model)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    learner = Learner(model, [p for p in model.parameters() if p.requires_grad], opt)
    ctx = UpdateContext(torch.device("cpu"), False, cfg.seed, 0, None, cfg.rollout.temperature)
    return cfg, model, batch, scores, adv, learner, ctx


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_micro_batches_accumulate_to_the_whole_mini_batch_gradient(agg):
    weights = []
    for micro_tokens in (4096, 16):  # one micro-batch; 1-2 rows per micro-batch (rows of 4-10 tokens)
        cfg, model, batch, scores, adv, learner, ctx = _setup(micro_tokens)
        cfg.update.loss_agg = agg
        if micro_tokens == 16:
            assert len(micro_batch_rows(batch, micro_tokens)) >= 3
        off = off_policy(cfg, batch, scores)
        stats = actor_update(learner, batch, scores, Advantages(adv, None), off, cfg.update, ctx)
        assert stats.metrics["actor/grad_norm"] > 0
        weights.append([p.detach().clone() for p in model.parameters()])
    for whole, split in zip(*weights):
        torch.testing.assert_close(split, whole, atol=2e-6, rtol=0)


def test_a_loop_that_skips_or_mixes_up_a_micro_batch_loss_is_refused_before_the_optimizer_steps():
    cfg, model, batch, scores, adv, learner, ctx = _setup(16)
    off = off_policy(cfg, batch, scores)
    inputs = ActorInputs(adv, off.anchor, None, off.is_weights)
    before = [p.detach().clone() for p in model.parameters()]

    update = Update(learner, batch, off.loss_mask, cfg.update, ctx, ACTOR)
    with pytest.raises(RuntimeError, match="not given to Update.backward"):
        for _ in update:  # no loss given
            pass
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # no optimizer step ran

    update = Update(learner, batch, off.loss_mask, cfg.update, ctx, ACTOR)
    micros = iter(update)
    first = next(micros)
    out = actor_loss(model, first.batch, first.take(inputs), first.mask, cfg.update, ctx)
    update.backward(first, out)
    with pytest.raises(RuntimeError, match="not the one the loop is at"):
        update.backward(first, out)  # the same micro-batch twice
