"""The recipes choose estimators from tables keyed by the config's Literal: every value the config
accepts has an entry, the entry is the estimator the name says (by hand), and the PPO advantage
stage puts the critic's targets where its estimator defines returns."""

from __future__ import annotations

import math
import typing
from types import SimpleNamespace

import pytest
import torch

from vagent.runconfig import GRPOEstimator, PPOEstimator, load_config
from vagent.recipes.grpo import GRPO_ESTIMATORS, trajectory_advantages
from vagent.recipes.ppo import PPO_ESTIMATORS, ppo_advantages
from vagent.recipes.stages import PPOScores


def test_every_configurable_estimator_has_an_entry_and_no_other():
    assert set(PPO_ESTIMATORS) == set(typing.get_args(PPOEstimator))
    assert set(GRPO_ESTIMATORS) == set(typing.get_args(GRPOEstimator))


def group_batch() -> SimpleNamespace:
    """One group of three one-row trajectories with scores 1, 0, 0 and two sampled tokens each."""
    M = torch.tensor([[0, 1, 1]] * 3, dtype=torch.bool)
    return SimpleNamespace(batch_size=3, traj_ids=torch.tensor([0, 1, 2]), group_ids=torch.zeros(3, dtype=torch.long),
                           episode_returns=torch.tensor([1.0, 0.0, 0.0]), loss_mask=M)


@pytest.mark.parametrize("estimator, expected", [
    # grpo: (R - mean) / std, std unbiased: mean 1/3, std sqrt(1/3)
    ("grpo", [(2 / 3) / math.sqrt(1 / 3), (-1 / 3) / math.sqrt(1 / 3), (-1 / 3) / math.sqrt(1 / 3)]),
    # rloo: R_i - mean of the others
    ("rloo", [1.0, -0.5, -0.5]),
])
def test_grpo_table_entries_by_hand(estimator, expected):
    cfg = load_config(None, ["recipe=grpo", "rollout.group_size=3", f"grpo.estimator={estimator}"])
    adv = trajectory_advantages(cfg, group_batch())
    for row, a in enumerate(expected):
        assert adv[row, 0] == 0  # not a sampled token
        assert torch.allclose(adv[row, 1:], torch.full((2,), a), atol=1e-5), (estimator, row, adv[row])


def turn_batch() -> SimpleNamespace:
    """One concat row with two turns of two sampled tokens (positions 1-2 and 4-5), reward 1 at the
    end of the second turn; not truncated."""
    M = torch.tensor([[0, 1, 1, 0, 1, 1]], dtype=torch.bool)
    ends = torch.tensor([[0, 0, 1, 0, 0, 1]], dtype=torch.bool)
    rewards = torch.tensor([[0, 0, 0, 0, 0, 1.0]])
    return SimpleNamespace(loss_mask=M, turn_end_mask=ends, token_rewards=rewards, truncated=torch.tensor([False]),
                           traj_ids=torch.tensor([0]), row_turn=torch.tensor([-1]))


@pytest.mark.parametrize("estimator", ["masked_gae", "bi_level_gae", "turn_gae"])
def test_ppo_stage_returns_and_critic_mask_by_hand(estimator):
    """V = 0, lam 1, gamma_turn 0.5, gamma_token 1, no whitening: the return of every token of turn 2
    is 1; turn 1's is 1 (masked_gae: discount per sampled token, gamma_token 1) or 0.5 (one turn
    back, bi_level / turn GAE). The critic trains on M, or on the turn ends for turn_gae."""
    cfg = load_config(None, [f"ppo.estimator={estimator}", "ppo.gamma_turn=0.5", "ppo.lam=1.0",
                             "ppo.whiten_advantages=false"])
    batch = turn_batch()
    zeros = torch.zeros(1, 6)
    scores = PPOScores(old_logprobs=zeros, ref_logprobs=None, values=zeros, final_values=torch.zeros(1))
    out = ppo_advantages(cfg, batch, scores, 1.0)
    first = 1.0 if estimator == "masked_gae" else 0.5
    expected_mask = batch.turn_end_mask if estimator == "turn_gae" else batch.loss_mask
    assert torch.equal(out.critic_mask, expected_mask)
    on = out.critic_mask
    want = torch.tensor([[0, first, first, 0, 1.0, 1.0]])
    assert torch.allclose(out.returns[on], want[on]), out.returns
    assert torch.equal(out.advantages, out.raw) and out.kl_ref is None
