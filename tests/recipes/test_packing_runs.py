"""update.packing end to end: 3 PPO / GRPO steps with packed forwards give the padded run's
parameters (within 1e-5) and the same losses; in a job of 2 ranks (FSDP2, gloo) as in one process."""

from __future__ import annotations

import pytest
import torch

from vagent.recipes.run import train
from vagent.runs import read_metrics

CASES = {
    "ppo-separate-critic-kl": ["ppo.critic_backbone=separate", "update.kl_coef=0.05", "update.kl_in=loss"],
    "ppo-shared-critic": ["ppo.critic_backbone=shared", "update.micro_batch_tokens=2000"],
    "grpo": ["recipe=grpo", "rollout.group_size=2", "update.kl_coef=0.01", "update.kl_in=loss"],
}


def final_weights(run) -> dict[str, torch.Tensor]:
    ck = sorted((run / "checkpoints").glob("step_*"))[-1]
    return {f"{f.stem}.{k}": v for f in ck.glob("*.pt") if f.name != "state.pt"
            for k, v in torch.load(f, weights_only=True).items()}


@pytest.mark.parametrize("case", list(CASES))
def test_packed_run_equals_padded_run(case, small_cfg, monkeypatch):
    import vagent.models.forward as forward

    packs: list[int] = []  # packed sequence lengths (a spy around the real pack)
    real_pack = forward.pack
    monkeypatch.setattr(forward, "pack", lambda *a: packs.append(a[1].shape[0]) or real_pack(*a))
    runs, calls = {}, {}
    for packing in ("false", "true"):
        cfg = small_cfg("steps=3", "rollout.temperature=0", "update.actor_lr=1e-4", "update.micro_batch_tokens=4096", f"update.packing={packing}",
                        f"name=packing-{packing}", *CASES[case])
        runs[packing] = train(cfg, quiet=True)
        calls[packing], packs[:] = list(packs), []
    assert not calls["false"] and calls["true"]  # the flag reaches the forwards, and only when on
    assert max(calls["true"]) >= 2  # micro-batches of several rows were packed
    padded, packed = final_weights(runs["false"]), final_weights(runs["true"])
    start = final_weights(runs["false"]).keys()
    assert padded.keys() == packed.keys() == start and padded
    for k in padded:
        torch.testing.assert_close(packed[k], padded[k], atol=1e-5, rtol=0, msg=lambda m, k=k: f"{k}: {m}")
    m0, m1 = ([r for r in read_metrics(runs[p] / "metrics.jsonl") if r["phase"] == "rl"] for p in ("false", "true"))
    assert len(m0) == len(m1) == 3
    for r0, r1 in zip(m0, m1):
        assert r0["rollout/batch_tokens"] == r1["rollout/batch_tokens"]
        for key in ("loss/policy", "loss/value", "actor/entropy", "actor/grad_norm", "actor/logprob_diff"):
            if key in r0:
                assert r1[key] == pytest.approx(r0[key], abs=1e-5, rel=1e-4), key


def test_two_ranks_packed_equal_one_process(tmp_path, tiny_vlm):
    """A packed PPO step (shared critic, KL reference) in a job of 2 ranks (torchrun, gloo, FSDP2;
    token-balanced row splits as without packing) equals the packed step of one process."""
    from tests.distributed.conftest import checkpoint_weights, max_rel_diff, train as train_job

    extra = ["update.packing=true", "update.micro_batch_tokens=4096", "ppo.critic_backbone=shared",
             "update.kl_coef=0.01", "update.kl_in=loss"]
    two = train_job(tmp_path, tiny_vlm, 2, "two", *extra)
    one = train_job(tmp_path, tiny_vlm, None, "one", *extra)
    ck = "checkpoints/step_000001"
    diff = max_rel_diff(checkpoint_weights(one / ck), checkpoint_weights(two / ck))
    assert diff < 1e-5, f"2 ranks vs 1 process, packed: weights differ by {diff:.2e} relative"
