"""A short learning test: on a toy env whose right answer is one token, PPO raises the success rate
from chance (after an SFT warm start on RANDOM labels, which teaches the format but not the task)
to well above it."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pytest

from vagent.envs.base import Observation, StepResult
from vagent.envs.formats import format_instruction, parse_response, FormatExample
from vagent.envs.registry import EnvConfig, register

WORDS = ("Down", "Right")  # each ONE token of the tiny tokenizer


@dataclass
class ToyConfig(EnvConfig):
    """Toy options."""

    #: reasoning format (the toy expects no_think: ``<answer>Down</answer>``)
    format: str = "no_think"
    #: the toy has text observations only
    render: str = "text"


class ToyChoiceEnv:
    """Toy: the observation names a direction; answering it gives reward 1, anything else 0.

    Action format: ``<answer>Down</answer>`` or ``<answer>Right</answer>``. Observation: "The arrow
    points left." Rewards: 1.0 for the named word. Episode end: after one step (terminated).
    Arguments: ToyConfig. Version: test-only.
    """

    Config = ToyConfig
    action_names = WORDS
    action_sep = ","

    def __init__(self, config: ToyConfig | None = None):
        self.config = config or ToyConfig()
        self.target = None

    def reset(self, seed: int):
        self.target = WORDS[int(np.random.default_rng(seed).integers(2))]
        word = self.target.lower()
        return Observation(f"The arrow points {word}: " + " ".join([word] * 8) + "."), {}

    def step(self, response: str) -> StepResult:
        p = parse_response(response, "no_think", ",", 1)
        ok = p.format_ok and p.actions == (self.target,)
        info = {"success": ok, "parsed": p}
        return StepResult(Observation("Done."), float(ok), True, False, info)

    def system_prompt(self) -> str:
        example = FormatExample("", "", "", "Down")
        return ("Answer with the direction the arrow points: Down or Right.\n"
                + format_instruction("no_think", example, "natural", ",", 1))

    def state(self) -> dict:
        return {"target": self.target}

    def close(self) -> None:
        pass


register("toy_choice", ToyChoiceEnv, overwrite=True)


def _random_label_chats(path, n: int) -> None:
    env, rng = ToyChoiceEnv(), np.random.default_rng(0)
    with open(path, "w") as f:
        for seed in range(n):
            obs, _ = env.reset(seed)
            answer = WORDS[int(rng.integers(2))]  # independent of the observation: chance level
            msgs = [{"role": "system", "content": env.system_prompt()}, {"role": "user", "content": obs.text},
                    {"role": "assistant", "content": f"<answer>{answer}</answer>"}]
            f.write(json.dumps({"messages": msgs}) + "\n")


@pytest.mark.slow
def test_ppo_learns_the_one_token_answer(tmp_path, tiny_vlm):
    from vagent.runconfig import load_config
    from vagent.recipes.run import train
    from vagent.runs import read_metrics

    _random_label_chats(tmp_path / "sft.jsonl", 64)
    cfg = load_config(None, [
        "name=toy", f"out_dir={tmp_path / 'runs'}", f"model.path={tiny_vlm}", "threads=1", "seed=1",
        "envs.0.name=toy_choice", "envs.0.config={}", "envs.0.n_train=32", "envs.0.n_val=32",
        "rollout.max_turns=1", "rollout.max_new_tokens=6",
        f"sft.data={tmp_path / 'sft.jsonl'}", "sft.steps=40", "sft.batch_size=8", "sft.lr=5e-3",
        "steps=24", "val.every=12", "update.actor_lr=1e-3", "update.epochs=2", "update.mini_batches=2",
        # k3 KL to the SFT policy: without it this lr learns the task (reward 0.97 at steps 16-18)
        # and then loses the answer format (format 0.53 by step 21, validation 1.0 -> 0.375)
        "update.warmup_steps=0", "update.kl_coef=0.05", "update.kl_kind=k3", "update.kl_in=loss", "ppo.critic_lr=1e-3", "ppo.critic_warmup_steps=0", "ppo.estimator=masked_gae", "ppo.whiten_advantages=false",
        "ppo.critic_backbone=separate",
        "log.tensorboard=false", "log.progress=false", "log.checkpoint_every=0", "log.plot_every=0", "log.plots=false",
        "log.rollouts_every=0",
    ])
    run = train(cfg, quiet=True)
    recs = [r for r in read_metrics(run / "metrics.jsonl") if r["phase"] == "rl"]
    val = [r["val/success_rate"] for r in recs if "val/success_rate" in r]
    reward = [r["reward/mean"] for r in recs if "reward/mean" in r]
    assert 0.2 <= val[0] <= 0.8, f"the random-label SFT should leave the policy near chance, got {val}"
    assert val[-1] >= 0.9, f"validation success {val}"
    assert np.mean(reward[-4:]) > np.mean(reward[:4]) + 0.25, reward
