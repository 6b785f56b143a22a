"""``vagent train`` with ``rollout.engine: vllm`` (vLLM's CPU build, marker ``vllm``): a 2-step PPO
run at temperature 0 with vLLM in the training process plays the same episodes as ``engine: hf``,
and so does a job of 2 ranks (torchrun, gloo) whose rollouts run on 2 vLLM replicas (Ray actors)
that rank 0 pushes the gathered FSDP2 weights to. A streaming run (``rollout.max_staleness: 1``)
generates on a vLLM replica while the trainer updates, with ``rollout.interrupt`` (a push stops
the replica's running replies by vLLM's request abort): every turn carries the weights version vLLM
stamped, the batches stay within K = 1 update, the schedule is recorded, the canary checks each
push, and the replica reports that it was built with the interrupt. The one-process vLLM run is
docs/models.md's training command as written (``.venv-vllm/bin/vagent train rollout.engine=vllm``,
from the repository) plus the overrides of a short tiny run.

The four runs start at once (one fixture; vLLM's start-up is most of their time). Every turn of
step 2 must come from the weights pushed after update 1 (version 1); the sampling-time log-probs
must equal the trainer's own re-scoring (``actor/logprob_diff``), which a missing push would break
(0.45 instead of 3e-6 when the push is skipped)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.distributed.conftest import SMALL, checkpoint_weights, max_rel_diff, metrics, train_cmd
from tests.vllm_tiny import build_vllm_tiny, docs_train_command

pytestmark = pytest.mark.vllm

REPO = Path(__file__).resolve().parents[2]
#: docs/models.md's ``.venv-vllm/bin/vagent train rollout.engine=vllm``: the "vllm" run is that command (from the
#: repository, with the venv's own entry point) plus the overrides that make it a short run of the tiny model
DOCS_TRAIN = docs_train_command()
#: whether that entry point is built here (scripts/vllm-env); without it the "vllm" run is ``python -m vagent train``
DOCS_ENTRY = REPO / DOCS_TRAIN[0]

TWO_STEPS = ["steps=2", "ppo.critic_backbone=separate", "update.kl_coef=0", "log.rollouts_every=1"]
RUNS = {
    "hf": (None, []),
    "vllm": (None, ["rollout.engine=vllm", "rollout.vllm_gpu_memory=0.02"]),  # KV cache: 2% of the RAM
    "job": (2, ["rollout.engine=vllm", "rollout.replicas=2", "rollout.vllm_gpu_memory=0.02"]),
    "stream": (None, ["rollout.engine=vllm", "rollout.replicas=1", "rollout.max_staleness=1", "rollout.schedule=async",
                      "rollout.temperature=1.0", "rollout.vllm_gpu_memory=0.02", "steps=3",
                      "rollout.interrupt=true"]),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """The runs of ``RUNS``, started together; their run directories."""
    tmp = tmp_path_factory.mktemp("vllm_training")
    model = build_vllm_tiny(tmp / "model")
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    env.pop("RAY_ADDRESS", None)
    procs = {}
    for name, (nproc, extra) in RUNS.items():
        args = [*SMALL, *TWO_STEPS, *extra, f"out_dir={tmp / name}", f"model.path={model}", "model.cache_dir=UNUSED"]
        cmd, cwd = train_cmd(nproc, *args), tmp
        if name == "vllm" and DOCS_ENTRY.exists():  # docs/models.md's command, as a user runs it
            cmd, cwd = [str(DOCS_ENTRY), *DOCS_TRAIN[1:], *args], REPO
        log = open(tmp / f"{name}.log", "w")
        procs[name] = (subprocess.Popen(cmd, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                        start_new_session=True), log, cmd)
    deadline = time.monotonic() + 900
    try:
        for name, (proc, log, cmd) in procs.items():
            try:
                code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pytest.fail(f"{' '.join(cmd)} did not finish in time (a hang?):\n{_tail(tmp / f'{name}.log')}")
            assert code == 0, f"{' '.join(cmd)} failed ({code}):\n{_tail(tmp / f'{name}.log')}"
    finally:
        for proc, log, _ in procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.wait()
            log.close()
    out = {}
    for name in RUNS:
        (run,) = [p for p in (tmp / name).iterdir() if p.is_dir()]
        out[name] = run
    return out


def _tail(path: Path, n: int = 6000) -> str:
    return path.read_text(errors="replace")[-n:]


def episodes(run: Path, step: int) -> list:
    """What each turn of step ``step``'s saved episodes played: reply text, sampled tokens, finish
    reason, reward."""
    lines = (run / "rollouts" / f"step_{step:06d}.jsonl").read_text().splitlines()
    return [[(t["reply"], t["n_sampled_tokens"], t["finish_reason"], t["reward"]) for t in json.loads(x)["turns"]]
            for x in lines]


def rl(run: Path) -> list[dict]:
    return [r for r in metrics(run) if r.get("phase") == "rl" and "loss/policy" in r]


def test_vllm_run_plays_the_same_episodes_as_hf(runs):
    hf, vl = rl(runs["hf"]), rl(runs["vllm"])
    assert [r["step"] for r in vl] == [1, 2]
    for step in (1, 2):
        got, want = episodes(runs["vllm"], step), episodes(runs["hf"], step)
        assert got == want, f"step {step}: vLLM played other episodes than HF"
        assert len({turns[0][0] for turns in want}) > 1, "the replies do not depend on the board: a weak check"
    for a, b in zip(hf, vl):
        for k in ("rollout/batch_tokens", "rollout/sampled_tokens", "reward/mean"):
            assert a[k] == b[k], (k, a[k], b[k])
    # the rollout after update k ran on version k, which vLLM stamped on every turn
    assert [(r["rollout/weights_version"], r["rollout/weights_lag"]) for r in vl] == [(0.0, 0.0), (1.0, 0.0)]
    # vLLM's sampling-time log-probs are the trainer's (fp32; measured 3e-6); with the push after
    # update 1 skipped (the version stamped, the weights not loaded) step 2's was 0.45
    assert all(r["actor/logprob_diff"] < 1e-4 for r in vl), [r["actor/logprob_diff"] for r in vl]
    # the weight-push canary checked vLLM at start-up and after the push of update 1, and passed
    assert all(r["sync/canary_max_abs_diff"] < 1e-3 and r["mismatch/kl"] < 1e-6 for r in vl), vl
    names = sorted(p.name for p in (runs["hf"] / "checkpoints").iterdir() if not p.name.startswith("."))
    for name in names:
        diff = max_rel_diff(checkpoint_weights(runs["hf"] / "checkpoints" / name),
                            checkpoint_weights(runs["vllm"] / "checkpoints" / name))
        assert diff < 1e-5, f"{name}: the vLLM run's weights differ from the hf run's by {diff:.2e}"


def test_job_of_two_ranks_trains_on_vllm_replicas(runs):
    """Rank 0 created the 2 replicas and pushed the gathered weights; rank 1 attached to them. The
    job trains like the one-process hf run (weights within 1e-4 relative, as for hf replicas)."""
    hf, job = rl(runs["hf"]), rl(runs["job"])
    assert [(r["rollout/weights_version"], r["rollout/weights_lag"]) for r in job] == [(0.0, 0.0), (1.0, 0.0)]
    for a, b in zip(hf, job):
        for k in ("rollout/batch_tokens", "rollout/sampled_tokens", "reward/mean"):
            assert a[k] == b[k], (k, a[k], b[k])
    assert all(r["actor/logprob_diff"] < 1e-4 for r in job), [r["actor/logprob_diff"] for r in job]
    # two ranks: rank 0 asked both replicas, both ranks ran the sharded trainer forward, the check passed
    assert all(r["sync/canary_max_abs_diff"] < 1e-3 for r in job), job
    for step in (1, 2):
        assert episodes(runs["job"], step) == episodes(runs["hf"], step), f"step {step}"
    names = sorted(p.name for p in (runs["hf"] / "checkpoints").iterdir() if not p.name.startswith("."))
    assert len(names) == 2
    for name in names:
        diff = max_rel_diff(checkpoint_weights(runs["hf"] / "checkpoints" / name),
                            checkpoint_weights(runs["job"] / "checkpoints" / name))
        assert diff < 1e-4, f"{name}: the job on vLLM replicas differs from one hf process by {diff:.2e}"


def test_a_streaming_run_generates_on_a_vllm_replica_within_its_staleness(runs):
    run = runs["stream"]
    steps = [r for r in metrics(run) if r.get("phase") == "rl" and "rollout/staleness_max" in r]
    assert [r["step"] for r in steps] == [1, 2, 3]
    for r in steps:  # every turn stamped by vLLM with the weights that sampled it, at most K = 1 update old
        assert 0 <= r["rollout/staleness_min"] <= r["rollout/staleness_mean"] <= r["rollout/staleness_max"] <= 1, r
        assert r["rollout/weights_lag"] == r["rollout/staleness_max"]
        assert r["sync/canary_max_abs_diff"] >= 0, r  # the canary checked the replica (over tolerance: the run fails)
    assert max(r["rollout/weights_version"] for r in steps) >= 1, "no batch was sampled by pushed weights"
    schedule = [json.loads(x) for x in (run / "rollout_schedule.jsonl").read_text().splitlines() if x.strip()]
    assert schedule[0]["max_staleness"] == 1 and [s["step"] for s in schedule[1:]] == [0, 1, 2]
    versions = {t["weights_version"] for x in (run / "rollouts" / "step_000003.jsonl").read_text().splitlines()
                for t in json.loads(x)["turns"]}
    assert versions and versions <= {1, 2}, f"step 3's turns were sampled by weights {versions}, not 1 or 2"
    # rollout.interrupt reached the vLLM replica: it reported, from its own engine, that a push stops its replies
    log = (run / "train.log").read_text()
    assert "rollout.interrupt: the replica reports that a waiting push stops the replies" in log, log[-3000:]


def test_the_docs_train_command_runs_in_the_vllm_venv(runs):
    """docs/models.md's training command, run from the repository with the venv's own ``vagent``
    entry point (the "vllm" run): it trains, and step 1's turns were sampled by vLLM with the weights
    pushed before it (version 0)."""
    if not DOCS_ENTRY.exists():
        pytest.skip(f"{DOCS_TRAIN[0]} is not built here (scripts/vllm-env)")
    first = rl(runs["vllm"])[0]
    assert first["rollout/weights_version"] == 0.0 and "sync/canary_max_abs_diff" in first
