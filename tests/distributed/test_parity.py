"""2 processes (torchrun, gloo, FSDP2) vs 1, the same global batch, through ``vagent train``: the
weights after each step agree within 1e-4 relative (measured: ~1e-7).

The runs roll out greedily so that both see the same episodes; every case is a real job of 2
ranks and a plain process, compared checkpoint by checkpoint (the 2-rank ones sharded with DCP)."""

from __future__ import annotations

import pytest
from safetensors.torch import load_file

from tests.distributed.conftest import SFT_PPO, checkpoint_weights, max_rel_diff, metrics, train

CASES = {
    # one SFT step, then two PPO steps with a separate critic (its own FSDP root), no reference
    # (the 2-process run is the session's shared sft_ppo_two job)
    "sft+ppo-separate-critic": SFT_PPO,
    # the tiny model built and caption-pretrained by the job (3 sharded steps), then a PPO step with
    # the shared critic (value head replicated, under the policy's root) + a KL reference copy; 3
    # rows over 2 ranks, one row per micro-batch: rank 0 runs 2 micro-batches, rank 1 one + padding
    "pretrain+ppo-shared-critic-kl-unequal": [
        "model.path=tiny", "model.cache_dir={out}/cache", "model.tiny_hidden=64", "model.tiny_image_size=64",
        "model.tiny_pretrain_steps=3", "model.tiny_pretrain_batch=4", "model.tiny_pretrain_relation_steps=0",
        "ppo.critic_backbone=shared", "update.kl_coef=0.01", "envs.0.n_train=3", "update.micro_batch_tokens=64"],
    # GRPO groups of 2 on LoRA adapters, KL in the loss to the adapter-free policy
    "grpo-lora": ["recipe=grpo", "rollout.group_size=2", "envs.0.n_train=2", "model.lora_rank=4",
                  "update.kl_coef=0.01", "update.kl_in=loss", "update.clip_high=0.28"],
}


@pytest.mark.parametrize("case", list(CASES))
def test_two_processes_equal_one(case, tmp_path, tiny_vlm_dir, request):
    extra = CASES[case]
    two = request.getfixturevalue("sft_ppo_two") if extra is SFT_PPO else train(tmp_path, tiny_vlm_dir, 2, "two", *extra)
    one = train(tmp_path, tiny_vlm_dir, None, "one", *extra)
    names = sorted(p.name for p in (one / "checkpoints").iterdir() if not p.name.startswith("."))
    assert names == sorted(p.name for p in (two / "checkpoints").iterdir() if not p.name.startswith("."))
    for name in names:
        w1 = checkpoint_weights(one / "checkpoints" / name)
        w2 = checkpoint_weights(two / "checkpoints" / name)
        diff = max_rel_diff(w1, w2)
        print(f"{case} {name}: 2 vs 1 process weights differ by {diff:.2e} relative")
        assert diff < 1e-4, f"{case}: {name} differs by {diff:.2e} relative"
    cache = one.parent / "cache"
    built = [d for d in cache.iterdir() if d.is_dir()] if cache.is_dir() else []
    assert len(built) == ("model.path=tiny" in extra)
    for d in built:  # the caption-pretrained model each run built
        w1, w2 = load_file(d / "model.safetensors"), load_file(two.parent / "cache" / d.name / "model.safetensors")
        diff = max_rel_diff({f"model.{k}": v for k, v in w1.items()}, {f"model.{k}": v for k, v in w2.items()})
        print(f"{case} caption-pretrained model: 2 vs 1 process weights differ by {diff:.2e} relative")
        assert diff < 1e-4
    m1, m2 = metrics(one), metrics(two)
    assert [(r["phase"], r["step"]) for r in m1] == [(r["phase"], r["step"]) for r in m2]
    for r1, r2 in zip(m1, m2):  # the same batch, and the same losses up to float rounding
        for k in ("rollout/batch_tokens", "rollout/sampled_tokens", "reward/mean"):
            assert r1.get(k) == r2.get(k), (case, k, r1.get(k), r2.get(k))
        for k in ("loss/policy", "loss/value", "actor/grad_norm", "critic/grad_norm", "sft/loss", "sft/grad_norm"):
            if k in r1:
                assert r2[k] == pytest.approx(r1[k], rel=1e-3, abs=1e-6), (case, k)  # loss/policy ~ 0 at ratio 1
    assert any(r.get("actor/grad_norm", 0) > 0 for r in m1)  # the step trained the policy
