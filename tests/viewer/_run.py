"""A two-step tiny run directory, written in seconds with the run's own writers.

Real FrozenLake episodes (vision render, env rewards and info) with scripted replies in the
grounding format, judged by the real rule judge (``ReasoningReward``: scores, anti-hacking
penalties and the judge's reasons); validation episodes on the same three seeds at every step
(``save_validation``); token rows
laid out as the concat batch does (system, [observation + image tokens + generation prompt],
sampled reply + end id, closing newline) through ``build_token_batch``; a fake character-level
encoder (id = code point) stands in for the tokenizer, so no model is built. Advantages, values
and returns are seeded random numbers on the loss mask. ``save_rollouts`` and
``save_token_rows`` write the dumps and ``MetricsLogger`` the metrics, as ``vagent train`` does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import torch

from vagent.envs.formats import parse_response
from vagent.envs.registry import make
from vagent.rollout.batch import build_token_batch
from vagent.rollout.policy import Conversation, Segment
from vagent.rollout.records import Episode, Turn
from vagent.runs import MetricsLogger, RunDir, save_rollouts, save_token_rows

IM_START, IM_END, IMAGE, PAD = 1, 2, 5, 0
SPECIAL = {IM_START: "<|im_start|>", IM_END: "<|im_end|>", IMAGE: "<|image_pad|>", PAD: "<pad>"}
ENV_CONFIG = {"render": "vision", "image_size": 48, "format": "grounding", "max_steps": 3}
REPLIES = [
    "<think><observation>The goal is below and to the right of you.</observation>"
    "<reasoning>Go right.</reasoning></think><answer>Right</answer>",
    "<think><observation>The goal is above you.</observation><reasoning>Go down.</reasoning></think>"
    "<answer>Down</answer>",
    "I will go left",  # no tags: a format error
    "<think><observation>The goal is above you.</observation><reasoning>Up.</reasoning></think>"
    "<answer>Up, Left</answer>",
]
VAL_SEEDS = (3, 8, 9)  # seed 3 is also a training seed of step 0 (a partly seed-paired comparison)
#: the rule judge; a description repeated twice in the window is "frequent" (anti-hacking penalty)
JUDGE = {"judge": "rule", "anti_hacking": {"min_count": 2}}


class CharTokenizer:
    def decode(self, ids, skip_special_tokens=False):
        return "".join(SPECIAL.get(i, chr(i)) for i in ids)


@dataclass
class FakeEncoder:
    tokenizer: CharTokenizer
    pad_token_id: int = PAD
    image_token_id: int = IMAGE
    eos_token_ids: tuple = (IM_END,)


def ids(text: str) -> list[int]:
    return [ord(c) for c in text]


def _user_segment(obs) -> Segment:
    n = len(obs.images)
    text = obs.text.replace("<image>", "\x00")
    body: list[int] = []
    for k, part in enumerate(text.split("\x00")):
        body += ids(part) + ([IMAGE] * 4 if k < n else [])
    tokens = [IM_START] + ids("user\n") + body + [IM_END] + ids("\n") + [IM_START] + ids("assistant\n")
    pixels = torch.zeros(16 * n, 8) if n else None
    grid = torch.tensor([[1, 4, 4]] * n) if n else None
    return Segment(tokens, False, pixel_values=pixels, image_grid_thw=grid, n_images=n)


def episode(seed: int, traj: int, step: int, gen: torch.Generator, env_config: dict = ENV_CONFIG) -> Episode:
    env = make("frozenlake", **env_config)
    obs, _ = env.reset(seed)
    conv = Conversation(segments=[Segment([IM_START] + ids("system\n" + env.system_prompt()) + [IM_END], False)])
    ep = Episode("frozenlake", dict(env_config), seed, traj, traj, env.system_prompt(), samples=[conv])
    for k in range(3):
        reply = REPLIES[(seed + k + step) % len(REPLIES)]
        before = env.state()
        res = env.step(reply)
        sampled = ids(reply) + [IM_END]
        lp = (-torch.rand(len(sampled), generator=gen)).tolist()
        turn = Turn(k, obs, reply, parse_response(reply, "grounding"), res.reward, res.reward,
                    res.terminated, res.truncated, dict(res.info), state_before=before, state_after=env.state(),
                    sampled_token_ids=sampled, sampled_logprobs=lp, n_images=len(obs.images))
        ep.turns.append(turn)
        conv.segments += [_user_segment(obs), Segment(sampled, True, logprobs=lp), Segment(ids("\n"), False)]
        obs = res.obs
        if res.terminated or res.truncated:
            ep.terminated, ep.truncated = res.terminated, res.truncated
            break
    ep.final_observation = obs
    if ep.truncated:
        ep.final_segment = _user_segment(obs)
    return ep


def make_run(root: Path, steps: int = 2, n_episodes: int = 6, rollouts_n: int | None = None,
             extra_clones: int = 0) -> dict:
    """Write the run under ``root``; returns {step: (episodes, batch, arrays, validation episodes)}.
    extra_clones: add this many summary-only copies of the first episode to the last step's JSONL
    (with distinct seeds, no token rows) to exercise paging."""
    from vagent.rewards import ReasoningReward
    from vagent.runs.samples import save_validation

    run = RunDir(root).make()
    judge = ReasoningReward(JUDGE)
    log = SimpleNamespace(rollouts_every=1, rollouts_n=rollouts_n or n_episodes, rollouts_max_mb=50.0)
    logger = MetricsLogger(run.root, tensorboard=False)
    enc, out = FakeEncoder(CharTokenizer()), {}
    for step in range(steps):
        gen = torch.Generator().manual_seed(step)
        eps = [episode(100 * step + s, s, step, gen) for s in range(n_episodes)]
        judge(eps)
        val = [episode(seed, v, step, gen) for v, seed in enumerate(VAL_SEEDS)]
        judge(val)
        save_validation(run.rollouts, step, val, log.rollouts_max_mb)
        batch = build_token_batch(eps, mode="concat", pad_token_id=PAD)
        M = batch.loss_mask
        arrays = {"logprobs": batch.old_logprobs + 0.01 * M, "advantages": torch.randn(M.shape, generator=gen) * M,
                  "values": torch.randn(M.shape, generator=gen) * M, "returns": torch.randn(M.shape, generator=gen) * M}
        logger.log(step, {"val/success_rate": 0.25 * step, "val/return": 0.3 * step, "val/format_accuracy": 0.5})
        save_token_rows(run.rollouts, step, log, batch, enc, **arrays)
        path = save_rollouts(run.rollouts, step, eps, log.rollouts_n, log.rollouts_max_mb)
        if extra_clones and step == steps - 1:
            first = path.read_text().splitlines()[0]
            with path.open("a") as f:
                for c in range(extra_clones):
                    f.write(first.replace(f'"seed": {eps[0].seed},', f'"seed": {10_000 + c},', 1) + "\n")
        logger.log(step, {"rollout/success_rate": sum(e.success for e in eps) / len(eps),
                          "rollout/return_mean": sum(e.total_reward for e in eps) / len(eps),
                          "rollout/format_accuracy": 0.5, "loss/policy": -0.01 * step})
        out[step] = (eps, batch, arrays, val)
    logger.close()
    summary = {"run_dir": str(run.root), "val_curve": [[0, 0.0], [1, 0.25]]}  # as vagent train writes at the end
    (run.root / "summary.json").write_text(json.dumps(summary))
    return out
