"""A ``rollout.overlap: 1`` run SIGKILLed right after a checkpoint and resumed equals the
uninterrupted run record for record (timings aside).

At a checkpoint after step k the rollout of step k+1 is in flight on the weights before update k
(version k). The checkpoint saves it (``inflight.pt``: the episodes, their weights version and
canary metrics) and the resume trains step k+1 on it; without it the resumed run samples step k+1
with the checkpoint's weights (version k+1), and ``rollout/weights_version``,
``rollout/weights_lag``, the ratio and everything after differ.

In one process the resumed run equals the uninterrupted one exactly. Two uninterrupted 2-rank
overlap-1 runs are not bitwise equal to each other (their weights differ by ~1e-9 after two
steps, the engine's recorded log-probs by ~1e-6: collectives of the update and the background
rollout's gather interleave differently; a mean of signed terms such as ``loss/policy`` then
differs by up to ~1e-4 relative), so in two ranks the weights versions must be equal and every
number within 1e-3 relative (1e-6 absolute).

Each run is killed as the OOM killer would kill it, one process: in one process the trainer, in
two ranks rank 1 (torchrun then stops rank 0, the Ray driver, without its cleanup running, and the
job names rank 1). No process of the run's Ray cluster may outlive it (Ray's agents were
reparented to init and outlived a killed trainer before the reaper's watchdog); the clusters live
in a Ray temp folder of the test's own (``own_ray_temp``), so no other run on the host reaps what
the watchdog must kill."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.distributed.conftest import (  # noqa: F401 (fixture)
    killed_after_checkpoint, metrics, run_job, tiny_vlm_dir, train, train_cmd,
)

pytest.importorskip("ray", reason="overlap needs engine replicas: pip install 'vagent[ray]'")

OVERLAP = ["steps=4", "rollout.overlap=1", "ppo.critic_backbone=separate", "update.kl_coef=0",
           "rollout.temperature=1.0"]


#: what the in-flight rollout decides, equal in any number of ranks
EXACT = {"phase", "step", "rollout/weights_version", "rollout/weights_lag", "mismatch/staleness", "rollout/batch_rows"}


def _comparable(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "time" and not k.startswith("perf/") and not k.endswith("_s")}
            for r in records]


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("nproc, replicas", [(None, 2), (2, 1)], ids=["1-rank-2-replicas", "2-ranks-1-replica"])
def test_a_resumed_overlap_run_equals_the_uninterrupted_one(tmp_path: Path, tiny_vlm_dir: Path, monkeypatch,
                                                            own_ray_temp: Path, nproc: int | None, replicas: int):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    overlap = [*OVERLAP, f"rollout.replicas={replicas}"]
    full = train(tmp_path, tiny_vlm_dir, nproc, "full", *overlap, timeout=400)
    cut = killed_after_checkpoint(tmp_path, tiny_vlm_dir, nproc, "cut", *overlap,
                                  kill="trainer" if nproc is None else "rank1")
    run_job(train_cmd(nproc, "--resume", str(cut)), tmp_path, timeout=400)
    a, b = _comparable(metrics(full)), _comparable(metrics(cut))
    assert [(r.get("phase"), r.get("step")) for r in a] == [(r.get("phase"), r.get("step")) for r in b]
    for ra, rb in zip(a, b):
        assert ra.keys() == rb.keys()
        if nproc is None:  # one process: the run is deterministic, so the resume is exact
            diff = {k: (ra[k], rb[k]) for k in ra if ra[k] != rb[k]}
        else:  # two ranks: the versions exact; the numbers as close as two uninterrupted runs are (see above):
            # means of signed terms (loss/policy) amplify the runs' 1e-9 weight noise to ~1e-4 relative, and the
            # canary's gap (sync/canary_max_abs_diff) is noise of ~5e-7 either way
            diff = {k: (ra[k], rb[k]) for k in ra if (ra[k] != rb[k] if k in EXACT else
                                                      ra[k] != pytest.approx(rb[k], rel=1e-3, abs=1e-6))}
        assert not diff, f"step {ra.get('step')}: {sorted(diff.items())[:8]}"


def test_an_in_flight_record_of_another_step_is_refused():
    from vagent.rollout.driver import InFlight, RolloutDriver
    from vagent.rollout.finish import RolloutResult

    sampled = []
    engine = type("Generator", (), {"weights_version": 0})()  # never asked: the saved episodes are used
    driver = RolloutDriver(lambda pol, k, unshard: sampled.append(k) or RolloutResult([]), None, engine=engine,
                           overlap=1, steps=5)
    try:
        saved = InFlight(step=3, version=2, episodes=RolloutResult([], {"rollout/x": 1.0}), sync={"sync/gap": 0.5})
        for bad in (InFlight(4, 3, RolloutResult([])), InFlight(3, 4, RolloutResult([])), {"step": 3}):
            with pytest.raises(ValueError, match="in-flight rollout"):
                driver.resume_in_flight(bad, 3)
        driver.resume_in_flight(saved, 3)
        assert driver._pending is not None and driver._pending[1].result() is saved.episodes and sampled == []
    finally:
        driver._pending = None
        driver.close()
