"""Reference bugs 2, 3 and 9 (docs/algorithms.md reference section 11), guarded at the recipe level: each test runs
the recipe's own code path and spies on what it actually does, so it fails when the recipe's
wiring breaks, not only when a library function does.

- bug 2: training and validation episodes come from disjoint seed splits (train vs val), in a
  real PPO run with validation;
- bug 3: the PPO recipe gives the critic update the estimator's critic mask (turn ends for
  turn_gae), not the loss mask;
- bug 9: ``vagent eval`` (hf backend) builds token-identical prompts to the recipe's rollout for
  the same env, seed and model.
"""

from __future__ import annotations

import pytest
import torch

import vagent.rollout
import vagent.rollout.loop


@pytest.fixture
def rollout_spy(monkeypatch):
    """Records (seeds, temperature, episodes) of every vagent.rollout.loop.rollout call."""
    calls = []
    real = vagent.rollout.loop.rollout

    def spy(specs, policy, sampling, *args, **kw):
        result = real(specs, policy, sampling, *args, **kw)
        calls.append(([s.seed for s in specs], sampling.temperature, list(result)))
        return result

    monkeypatch.setattr(vagent.rollout.loop, "rollout", spy)
    monkeypatch.setattr(vagent.rollout, "rollout", spy)
    return calls


def test_bug2_train_and_validation_seeds_come_from_disjoint_splits(small_cfg, rollout_spy):
    from vagent.recipes.run import train
    from vagent.seeds import split_of

    train(small_cfg("val.every=1", "steps=1", "envs.0.n_val=2", "rollout.max_turns=1"), quiet=True)
    train_seeds = [s for seeds, temp, _ in rollout_spy if temp > 0 for s in seeds]
    val_seeds = [s for seeds, temp, _ in rollout_spy if temp == 0 for s in seeds]
    assert len(train_seeds) == 2 and len(val_seeds) == 2 * 2  # 1 step x 2 envs; validation at 0 and 1
    assert {split_of(s) for s in train_seeds} == {"train"}
    assert {split_of(s) for s in val_seeds} == {"val"}
    assert not set(train_seeds) & set(val_seeds)


def test_bug3_ppo_recipe_gives_the_critic_the_estimator_mask(small_cfg, monkeypatch):
    import vagent.recipes.ppo as ppo
    from vagent.recipes.run import train

    seen = []
    real = ppo.critic_update

    def spy(critic, batch, scores, advantages, *args, **kw):
        seen.append((batch.turn_end_mask.clone(), batch.loss_mask.clone(), advantages.critic_mask.clone()))
        return real(critic, batch, scores, advantages, *args, **kw)

    monkeypatch.setattr(ppo, "critic_update", spy)
    train(small_cfg("ppo.estimator=turn_gae", "steps=1"), quiet=True)
    (turn_ends, loss_mask, critic_mask), = seen
    assert torch.equal(critic_mask.bool(), turn_ends.bool())  # returns exist only at turn ends
    assert critic_mask.sum() < loss_mask.sum()  # so this is not the loss mask


def test_bug9_eval_prompts_equal_the_recipe_rollout(small_cfg, rollout_spy, tmp_path):
    from vagent.eval.config import load_config as load_eval_config
    from vagent.eval.runner import run_eval
    from vagent.recipes.common import load_model
    from vagent.recipes.validation import validate
    from vagent.rollout.hf_policy import HFPolicy

    cfg = small_cfg("envs.0.n_val=2", "rollout.max_turns=2", "envs.0.config.format=grounding_worldmodeling")
    loaded = load_model(cfg, cfg.model.path, torch.device("cpu"))
    validate(HFPolicy(loaded, prefix_cache=cfg.rollout.prefix_cache), cfg)  # the recipe's greedy rollout
    (seeds, _, recipe_eps), = rollout_spy
    rollout_spy.clear()
    env = cfg.envs[0]
    run_eval(load_eval_config({
        "models": [{"backend": "hf", "model": cfg.model.path, "name": "tiny"}],
        "envs": [{"name": env.name, "config": {k: v for k, v in env.config.items() if k != "format"}}],
        "formats": [env.config["format"]], "seeds": ["val:0-1"], "max_turns": cfg.rollout.max_turns,
        "sampling": {"temperature": 0.0, "max_new_tokens": cfg.rollout.max_new_tokens},
        "out_dir": str(tmp_path / "eval"), "html": False, "print_table": False, "save_images": False,
    }))
    eval_eps = {e.seed: e for _, _, eps in rollout_spy for e in eps}
    assert sorted(eval_eps) == sorted(seeds)
    for ep in recipe_eps:
        other = eval_eps[ep.seed]
        assert other.system_prompt == ep.system_prompt
        assert [t.prompt_token_ids for t in other.turns] == [t.prompt_token_ids for t in ep.turns], ep.seed
        assert [t.sampled_token_ids for t in other.turns] == [t.sampled_token_ids for t in ep.turns], ep.seed
        assert ep.turns[0].prompt_token_ids  # token-level: there is something to compare
