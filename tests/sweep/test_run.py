"""``vagent sweep`` on a local Ray cluster (real subprocesses, tiny model on CPU): a 2 x 2 sweep
finishes and a second invocation runs nothing new; a sweep killed mid-trial (SIGKILL of its
process group) and run again completes the trial from its checkpoint with the metrics of an
uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from vagent.runs import read_metrics

from tests.ray_sessions import outlives
from tests.waiting import wait_for_file

from .conftest import run_sweep_process, sweep_cmd, write_sweep

pytest.importorskip("ray.tune", reason="vagent sweep needs Ray Tune: pip install 'vagent[ray]'")


def _events(sweep_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (sweep_dir / "events.jsonl").read_text().splitlines()]


def _run_dir(sweep_dir: Path, trial_id: str) -> Path:
    runs = [p for p in (sweep_dir / "trials" / trial_id).iterdir() if p.is_dir()]
    assert len(runs) == 1, runs
    return runs[0]


def _comparable(run: Path) -> list[dict]:
    """Every record with timing fields removed (as tests/recipes/test_resume.py)."""
    return [{k: v for k, v in r.items() if not k.startswith("perf/") and k not in ("time", "val/time_s")}
            for r in read_metrics(run / "metrics.jsonl")]


# a one-step trial takes seconds on an idle machine; these bounds leave room for a loaded 2-core one
@pytest.mark.timeout(2400)
def test_two_configs_two_seeds_finish_and_a_second_invocation_runs_nothing(tmp_path, tiny_vlm):
    sweep_file = write_sweep(tmp_path / "s.yaml", tiny_vlm, grid={"ppo.estimator": ["masked_gae", "bi_level_gae"]},
                             seeds=[0, 1], baseline="estimator=bi_level_gae")
    out = tmp_path / "sweep"
    first = run_sweep_process(sweep_file, out)
    assert first.returncode == 0, first.stdout + first.stderr
    ids = [f"estimator={e}/seed_{s}" for e in ("masked_gae", "bi_level_gae") for s in (0, 1)]
    assert sorted(e["trial"] for e in _events(out) if e["event"] == "start") == sorted(ids)
    assert sorted(e["trial"] for e in _events(out) if e["event"] == "finish") == sorted(ids)
    for trial_id in ids:  # each trial is an ordinary run directory with its own seed and estimator
        run = _run_dir(out, trial_id)
        cfg = yaml.safe_load((run / "config.yaml").read_text())
        assert (cfg["seed"], cfg["ppo"]["estimator"]) == (int(trial_id[-1]), trial_id.split("=")[1].split("/")[0])
        assert [r["step"] for r in read_metrics(run / "metrics.jsonl") if "val/success_rate" in r] == [0, 1]
        assert (run / "summary.json").is_file() and (run / "checkpoints").is_dir()
    before = {p: p.stat().st_mtime_ns for p in out.glob("trials/*/*/*/metrics.jsonl")}
    n_events = len(_events(out))

    again = run_sweep_process(sweep_file, out)
    assert again.returncode == 0, again.stdout + again.stderr
    assert len(_events(out)) == n_events  # Tune restored the experiment: no trial ran, not even to skip
    assert {p: p.stat().st_mtime_ns for p in out.glob("trials/*/*/*/metrics.jsonl")} == before
    assert len(list(out.glob("trials/*/*/*/config.yaml"))) == 4

    report = subprocess.run(sweep_cmd("report", str(out)), capture_output=True, text=True, timeout=300)
    assert report.returncode == 0, report.stderr
    rep = json.loads((out / "report" / "report.json").read_text())
    assert rep["baseline"] == "estimator=bi_level_gae" and rep["missing"] == []
    assert rep["metrics"]["val_success_final"]["estimator=masked_gae"]["n"] == 2


@pytest.mark.timeout(2400)
def test_sigkill_of_the_sweep_then_rerun_resumes_the_trial_from_its_checkpoint(tmp_path, tiny_vlm):
    sweep_file = write_sweep(tmp_path / "s.yaml", tiny_vlm, seeds=[0], overrides={
        "steps": 4, "val.every": 2, "log.keep_last": 2, "rollout.temperature": 1.0})
    out = tmp_path / "sweep"
    proc = subprocess.Popen(sweep_cmd(str(sweep_file), "--out", str(out), "--num-cpus", "2", "--quiet"),
                            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for_file(proc, out, "trials/base/seed_0/*/checkpoints/step_000002/state.pt",
                  "the trial's second RL checkpoint", 900)
    os.killpg(proc.pid, signal.SIGKILL)  # the sweep, its Ray head processes and the raylet
    proc.wait()
    # the trial's worker (a child of the raylet in a process group of its own) ends with its raylet
    assert outlives(proc.pid, seconds=10) == []
    run = _run_dir(out, "base/seed_0")
    assert not (run / "summary.json").exists()  # the trial really was killed mid-run

    again = run_sweep_process(sweep_file, out)
    assert again.returncode == 0, again.stdout + again.stderr
    assert [e["event"] for e in _events(out)] == ["start", "resume", "finish"]
    assert _run_dir(out, "base/seed_0") == run and "resuming from" in (run / "train.log").read_text()

    # the uninterrupted reference: vagent train with the trial's own config.yaml
    ref_root = tmp_path / "ref"
    subprocess.run([sys.executable, "-m", "vagent.cli", "train", "--quiet", "--config", str(run / "config.yaml"),
                    f"out_dir={ref_root}"], check=True, timeout=900)
    (ref,) = list(ref_root.iterdir())
    a, b = _comparable(ref), _comparable(run)
    assert [(r["phase"], r["step"]) for r in a] == [(r["phase"], r["step"]) for r in b]
    assert a == b
