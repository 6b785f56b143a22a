"""Sharded checkpoints: a 2-process checkpoint resumes in 1 process (DCP re-shards on load); the
policy it exports and its manifest. (A 2-process job with a killed rank resumes to the
uninterrupted job's metrics and weights: tests/distributed/test_rank_failure.py.)"""

from __future__ import annotations

import shutil

import pytest
import torch

from tests.distributed.conftest import checkpoint_weights, max_rel_diff, metrics, run_job, train_cmd


def _comparable(records: list[dict]) -> list[dict]:
    """Metric records without wall-clock fields (time, perf/*)."""
    return [{k: v for k, v in r.items() if k != "time" and not k.startswith("perf/") and not k.endswith("time_s")}
            for r in records]


def test_two_process_checkpoint_resumes_in_one(sft_ppo_two, tmp_path):
    run = tmp_path / sft_ppo_two.name
    shutil.copytree(sft_ppo_two, run)
    shutil.rmtree(run / "checkpoints" / "step_000002")
    (run / "summary.json").unlink()  # as if killed during step 2 (a finished run's resume changes nothing)
    done = run_job(train_cmd(None, "--resume", str(run)), tmp_path)
    assert "this checkpoint was written by 2 rank(s) and this job has 1" in done.stdout, done.stdout[-3000:]
    assert "ranks: 1 (one process)" in done.stdout
    resumed, expected = metrics(run), metrics(sft_ppo_two)
    assert [(r["phase"], r["step"]) for r in resumed] == [(r["phase"], r["step"]) for r in expected]
    n_kept = len(resumed) - 1  # the records up to step 2 are the 2-process run's, kept
    assert _comparable(resumed[:n_kept]) == _comparable(expected[:n_kept])
    a = checkpoint_weights(run / "checkpoints" / "step_000002")  # written by one process (<name>.pt)
    b = checkpoint_weights(sft_ppo_two / "checkpoints" / "step_000002")
    diff = max_rel_diff(b, a)
    print(f"2 -> 1 process resume: step-2 weights differ by {diff:.2e} relative from the 2-process run")
    assert diff < 1e-4
    for k in ("loss/policy", "loss/value", "actor/grad_norm", "critic/grad_norm"):
        assert resumed[-1][k] == pytest.approx(expected[-1][k], rel=1e-3, abs=1e-6), k


def test_exported_policy_loads_with_the_sharded_weights(sft_ppo_two):
    """A sharded checkpoint's policy/ (gathered, written by rank 0) is a from_pretrained directory
    holding exactly the policy weights of the checkpoint's DCP shards."""
    from vagent.models.loading import load_policy

    ckpt = sft_ppo_two / "checkpoints" / "step_000002"
    exported = load_policy(ckpt / "policy").model.state_dict()
    sharded = {k[len("policy."):]: v for k, v in checkpoint_weights(ckpt).items() if k.startswith("policy.")}
    assert exported.keys() == sharded.keys()
    assert all(torch.equal(exported[k], sharded[k]) for k in sharded)


def test_sharded_checkpoint_has_a_manifest_and_a_damaged_shard_is_skipped(sft_ppo_two, tmp_path):
    """The manifest of a sharded checkpoint covers every rank's files (DCP shards, RNG states); a
    flipped byte in one shard is named, and the resume's choice falls back to the intact checkpoint."""
    import json

    from vagent.runs.checkpoint import CheckpointError, load_checkpoint, select_checkpoint

    ckpts = shutil.copytree(sft_ppo_two / "checkpoints", tmp_path / "checkpoints")
    listed = json.loads((ckpts / "step_000002" / "manifest.json").read_text())["files"]
    assert {"state.pt", "rng_rank0.pt", "rng_rank1.pt", "dcp/.metadata", "policy/config.json"} <= set(listed)
    assert any(k.startswith("dcp/__1_") for k in listed), "rank 1's shard is listed"
    assert not [p for p in ckpts.iterdir() if p.name.startswith(".tmp-")]
    shard = sorted((ckpts / "step_000002" / "dcp").glob("__1_*.distcp"))[0]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    said: list[str] = []
    assert select_checkpoint(ckpts, say=said.append).path.name == "step_000001"
    assert f"({shard.relative_to(ckpts / 'step_000002').as_posix()} does not match" in said[0]
    with pytest.raises(CheckpointError, match="checkpoints beside it that pass their checks: sft_000001, step_000001"):
        load_checkpoint(ckpts / "step_000002", {"policy": torch.nn.Linear(2, 2)})
