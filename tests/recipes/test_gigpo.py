"""GiGPO in the GRPO recipe (grpo.estimator: gigpo): step-level groups from env states, by hand,
in both batch layouts, from every built-in env's state, and a two-step run; PPO's variance filter."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch

from vagent.runconfig import load_config
from vagent.recipes.stages import filter_groups
from vagent.recipes.grpo import trajectory_advantages

GRPO = ["recipe=grpo", "rollout.group_size=2", "grpo.estimator=gigpo", "grpo.gigpo_gamma=0.5",
        "grpo.gigpo_omega=1.0"]


def hand_batch(per_turn: bool):
    """Two trajectories of one group, two turns of 2 sampled tokens each. Both start in state s0;
    then trajectory 0 sees s1 and gets reward 1 at turn 1, trajectory 1 sees s2 and gets 0."""
    rewards = {(0, 1): 1.0}
    keys = {0: ["s0", "s1"], 1: ["s0", "s2"]}
    rows = [(t, k) for t in (0, 1) for k in (0, 1)] if per_turn else [(t, None) for t in (0, 1)]
    L = 4 if not per_turn else 3
    B = len(rows)
    M = torch.zeros(B, L, dtype=torch.bool)
    end = torch.zeros(B, L, dtype=torch.bool)
    tidx = torch.full((B, L), -1)
    rew = torch.zeros(B, L)
    state_keys, row_turn = [], []
    for b, (t, k) in enumerate(rows):
        turns = [k] if per_turn else [0, 1]
        for j, turn in enumerate(turns):
            pos = slice(1, 3) if per_turn else slice(2 * j, 2 * j + 2)
            M[b, pos] = True
            tidx[b, pos] = turn
            last = pos.stop - 1
            end[b, last] = True
            rew[b, last] = rewards.get((t, turn), 0.0)
        state_keys.append([keys[t][k]] if per_turn else keys[t])
        row_turn.append(k if per_turn else -1)
    return SimpleNamespace(
        batch_size=B, traj_ids=torch.tensor([t for t, _ in rows]), group_ids=torch.zeros(B, dtype=torch.long),
        episode_returns=torch.tensor([1.0 if t == 0 else 0.0 for t, _ in rows]), loss_mask=M, turn_end_mask=end,
        turn_index=tidx, token_rewards=rew, state_keys=state_keys, row_turn=torch.tensor(row_turn))


@pytest.mark.parametrize("per_turn", [False, True], ids=["concat", "per_turn"])
def test_a_shared_state_gets_the_step_level_group(per_turn):
    """By hand (gamma 0.5, omega 1): A_E = +-(1 - 0.5) / std([1, 0]) = +-0.7071. Turn 0 of both
    trajectories is state s0: one step group, returns G = 0 + 0.5 * 1 = 0.5 and 0, so A_S = +-0.7071.
    Turn 1 (s1, s2) are singletons: A_S = 0. So turn 0 tokens get +-1.4142, turn 1 tokens +-0.7071."""
    cfg = load_config(None, GRPO)
    batch = hand_batch(per_turn)
    adv = trajectory_advantages(cfg, batch)
    a = 0.5 / math.sqrt(0.5)  # (1 - 0.5) / std([1, 0]), the unbiased std is 0.7071
    for b in range(batch.batch_size):
        sign = 1.0 if int(batch.traj_ids[b]) == 0 else -1.0
        for p in batch.loss_mask[b].nonzero()[:, 0].tolist():
            want = sign * (a + (a if int(batch.turn_index[b, p]) == 0 else 0.0))
            assert float(adv[b, p]) == pytest.approx(want, abs=1e-4), (b, p)
    assert (adv[~batch.loss_mask] == 0).all()
    # plain GRPO gives every token of a trajectory the same advantage: the step group is GiGPO's
    grpo = trajectory_advantages(load_config(None, GRPO + ["grpo.estimator=grpo"]), batch)
    assert torch.allclose(grpo[batch.loss_mask].abs(), torch.full_like(grpo[batch.loss_mask], a), atol=1e-4)


def test_every_builtin_env_gives_a_true_state_key():
    """GiGPO keys a step on env.state() (JSON, no pixels): every built-in env's state after reset
    is JSON-able, the same for the same seed in two instances, and image envs (render vision)
    key on the state, not on the image."""
    from vagent.envs import list_envs, make, state_key
    from vagent.envs.registry import env_class

    seen = []
    for name in list_envs():
        if not hasattr(env_class(name).Config, "render"):
            continue
        keys = []
        for _ in range(2):
            env = make(name)
            try:
                obs, _ = env.reset(3)
                state = env.state()
                json.dumps(state)  # no images or numpy objects in it
                keys.append(state_key(state))
            finally:
                env.close()
        assert keys[0] == keys[1], name
        seen.append(name)
    assert {"frozenlake", "sokoban", "navigation", "primitive_skill", "svg"} <= set(seen)


def test_gigpo_and_ppo_filter_train_from_the_config(small_cfg):
    from vagent.recipes.run import train
    from vagent.runs import read_metrics

    run = train(small_cfg(*GRPO, "steps=1", "update.kl_in=loss"), quiet=True)
    rl = [r for r in read_metrics(run / "metrics.jsonl") if r.get("phase") == "rl" and "loss/policy" in r]
    assert len(rl) == 1 and math.isfinite(rl[0]["loss/policy"]) and rl[0]["actor/advantage_abs_mean"] >= 0
    run = train(small_cfg("steps=1", "rollout.group_size=2", "ppo.filter=top_k", "ppo.filter_value=0.5"), quiet=True)
    rl = [r for r in read_metrics(run / "metrics.jsonl") if r.get("phase") == "rl" and "loss/policy" in r]
    assert [r["filter/kept_groups"] for r in rl] == [1.0]  # 2 groups, the top half


def test_ppo_filter_keeps_whole_groups():
    cfg = load_config(None, ["rollout.group_size=2", "ppo.filter=top_k", "ppo.filter_value=0.5"])
    batch = hand_batch(per_turn=False)
    batch.group_ids = torch.tensor([0, 1])
    batch.episode_returns = torch.tensor([1.0, 0.0])
    batch.select = lambda rows: rows
    kept = filter_groups(batch, cfg.ppo)
    assert kept.scale == 1.0 and kept.metrics["filter/kept_groups"] == 1.0 and len(kept.batch) == 1
