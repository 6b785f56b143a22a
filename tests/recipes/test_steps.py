"""One PPO / GRPO step on the tiny VLM, for every estimator and context mode: the parameters
change, the losses are finite, and the run directory holds what it should."""

from __future__ import annotations

import json
import math

import pytest
import torch

from vagent.recipes.run import train
from vagent.runs import read_metrics

CASES = {
    "ppo-masked_gae-separate_critic": ["ppo.estimator=masked_gae", "ppo.critic_backbone=separate"],
    "ppo-bi_level_gae-kl_reward": ["ppo.estimator=bi_level_gae", "update.kl_coef=0.05", "update.kl_kind=k1",
                                   "update.kl_in=reward"],
    "ppo-no_kl-whiten-reasoning_reward": ["update.kl_coef=0", "ppo.whiten_advantages=true",
                                          "reasoning_reward={judge: rule}"],
    "ppo-turn_gae-window-kl_loss-separate_critic": ["ppo.estimator=turn_gae", "rollout.window=1",
                                                    "update.kl_coef=0.05", "update.kl_in=loss", "update.kl_kind=k2",
                                                    "ppo.critic_backbone=separate"],
    "ppo-no_concat_gae": ["rollout.mode=no_concat", "ppo.estimator=no_concat_gae", "ppo.anchor=last"],
    "ppo-shared_critic-2mini": ["ppo.critic_backbone=shared", "update.mini_batches=2", "update.micro_batch_tokens=300",
                                "rollout.prefix_cache=false"],
    "grpo-concat-filter-kl": ["recipe=grpo", "rollout.group_size=2", "grpo.filter=top_p", "grpo.filter_value=0.9",
                              "update.kl_coef=0.01", "update.kl_kind=k3", "update.kl_in=loss", "update.dual_clip=3",
                              "update.clip_high=0.28"],
    "grpo-no_concat-rloo": ["recipe=grpo", "rollout.group_size=2", "rollout.mode=no_concat", "grpo.estimator=rloo"],
    "grpo-reinforce_pp": ["recipe=grpo", "rollout.group_size=2", "grpo.estimator=reinforce_pp",
                          "update.loss_agg=seq-mean-token-mean"],
    "ppo-token_tis-token_rejection": ["rollout_correction.is_level=token", "rollout_correction.rs_level=token",
                                      "rollout_correction.rs_high=1.5"],
    "grpo-sequence_tis-veto": ["recipe=grpo", "rollout.group_size=2", "rollout_correction.is_level=sequence",
                               "rollout_correction.veto_threshold=0.0001"],
}


@pytest.fixture(scope="module")
def initial_weights(tiny_vlm):
    from vagent.models.loading import load_policy

    return {k: v.clone() for k, v in load_policy(tiny_vlm).model.state_dict().items()}


@pytest.mark.parametrize("name", list(CASES))
def test_one_step_updates_and_stays_finite(name, small_cfg, initial_weights):
    cfg = small_cfg("steps=1", *CASES[name])
    run = train(cfg, quiet=True)
    rec = [r for r in read_metrics(run / "metrics.jsonl") if r["phase"] == "rl"]
    assert len(rec) == 1
    m = rec[0]
    assert m["rollout/episodes"] == 2 * cfg.rollout.group_size
    losses = ["loss/policy", "actor/entropy", "actor/grad_norm"] + (["loss/value", "critic/grad_norm"] if cfg.recipe == "ppo" else [])
    for key in losses:
        assert isinstance(m[key], float) and math.isfinite(m[key]), (key, m.get(key))
    assert m["actor/logprob_diff"] < 1e-3  # recomputed log pi_old matches the sampling-time log-probs
    # the engine/trainer gap of the same tokens at the same weights (overlap 0): the same mean |diff|
    assert m["mismatch/abs_logprob_diff_mean"] == pytest.approx(m["actor/logprob_diff"], abs=1e-9)
    assert 0 <= m["mismatch/kl"] < 1e-4 and m["mismatch/abs_logprob_diff_max"] < 1e-2
    assert m["mismatch/ppl_ratio"] == pytest.approx(1.0, abs=1e-3)
    # every sampled token follows the turn-0 image (vision FrozenLake): all of them are in the image split
    assert m["mismatch/kl_image"] == m["mismatch/kl"] and "mismatch/kl_text" not in m
    corrected = cfg.rollout_correction
    if corrected.is_level != "none":  # HF engine = trainer up to rounding: weights ~1, nothing truncated
        assert m["correction/is_mean"] == pytest.approx(1.0, abs=1e-3) and m["correction/is_truncated_frac"] < 0.5
    if corrected.rs_level != "none" or corrected.veto_threshold is not None:
        assert m["correction/rejected_token_frac"] == 0.0
    else:
        assert not any(k.startswith("correction/") for k in m)
    if cfg.reasoning_reward:
        assert "reward/judged_turns" in m
    assert not list((run / "plots").glob("*")), "log.plots false (SMALL): no figure is drawn, not even at the end"
    ck = run / "checkpoints" / "step_000001"
    policy = torch.load(ck / "policy.pt", weights_only=True)
    changed = [k for k, v in policy.items() if not torch.equal(v, initial_weights[k])]
    assert changed, "no policy parameter changed"
    assert all(torch.isfinite(v).all() for v in policy.values())
    if cfg.recipe == "ppo":
        # the head's N(0, 1e-3) init is itself non-zero, so "not all zero" proves nothing: the head's
        # weight took AdamW steps with a non-zero gradient (its first moment), which moves it by ~lr
        critic = torch.load(ck / "critic.pt", weights_only=True)
        head = critic["value_head.weight"]
        state = torch.load(ck / "state.pt", weights_only=False)["optimizers"]["critic"]["state"]
        head_states = [s for s in state.values() if s["exp_avg"].shape == head.shape]
        assert head_states and all(float(s["step"]) >= 1 and s["exp_avg"].abs().sum() > 0 for s in head_states)
        assert torch.isfinite(head).all()
    # the run directory: resolved config, saved rollouts with frames, an exported model, a summary
    assert (run / "config.yaml").is_file() and (run / "summary.json").is_file()
    ep = json.loads((run / "rollouts" / "step_000001.jsonl").read_text().splitlines()[0])
    assert ep["turns"] and (run / "rollouts" / ep["turns"][0]["frames"][0]).is_file()
    assert (ck / "policy" / "config.json").is_file()
