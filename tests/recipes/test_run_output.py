"""One real ``vagent train`` (a fresh, caption-pretrained tiny model, demos, SFT, 2 PPO steps) and
what it leaves: one step convention across metrics, rollouts and checkpoints, the last step's
rollouts, progress lines with ETA in train.log (the model build's included), a console without
library warnings or progress bars and without the whole config, and a ``--resume`` of the
finished run that changes nothing."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

from vagent.runs import read_metrics

from .conftest import SMALL

ARGS = ["model.path=tiny", "model.tiny_hidden=64", "model.tiny_layers=1", "model.tiny_image_size=64",
        "model.tiny_pretrain_steps=3", "model.tiny_pretrain_relation_steps=0", "model.tiny_pretrain_batch=2",
        "sft.steps=2", "sft.demos_per_env=2", "sft.batch_size=2", "sft.actions_per_turn=1", "val.every=1",
        "ppo.critic_warmup_steps=1", "log.plot_every=1", "log.plots=true"]


def _train(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vagent.cli", "train", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=1200)


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """(run directory, console output) of a finished two-step run."""
    tmp = tmp_path_factory.mktemp("run-output")
    overrides = [a for a in SMALL if not a.startswith("model.cache_dir")] + ARGS
    done = _train(*overrides, f"out_dir={tmp / 'runs'}", f"model.cache_dir={tmp / 'cache'}", cwd=tmp)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (run,) = (tmp / "runs").iterdir()
    return run, done.stdout + done.stderr


def test_one_step_convention_and_the_last_steps_rollouts(finished):
    run, _ = finished
    records = read_metrics(run / "metrics.jsonl")
    sft = [r["step"] for r in records if r["phase"] == "sft"]
    train = [r["step"] for r in records if r["phase"] == "rl" and "rollout/episodes" in r]
    val = [r["step"] for r in records if r["phase"] == "rl" and "val/success_rate" in r]
    assert (sft, train, val) == ([1, 2], [1, 2], [0, 1, 2])
    rollouts = sorted(p.stem for p in (run / "rollouts").glob("step_*.jsonl"))
    tokens = sorted(p.name.split(".")[0] for p in (run / "rollouts").glob("step_*.tokens.json"))
    checkpoints = sorted(p.name for p in (run / "checkpoints").glob("step_*"))
    assert rollouts == tokens == checkpoints == ["step_000001", "step_000002"]
    assert sorted(p.name for p in (run / "checkpoints").glob("sft_*")) == ["sft_000001", "sft_000002"]


def test_train_log_has_every_phases_progress_with_eta(finished):
    run, _ = finished
    log = (run / "train.log").read_text()
    for phase in ("caption pretraining (grid) 3/3", "demos 2/2", "SFT 2/2", "PPO 1/2", "PPO 2/2"):
        lines = [ln for ln in log.splitlines() if ln.startswith(phase + " [")]
        assert len(lines) == 1 and ", ETA " in lines[0], (phase, log[-3000:])
    assert log.index("building tiny model") < log.index("caption pretraining (grid) 3/3") < log.index("config: ")
    assert "validation @ step 0" in log and "validation @ step 2" in log
    for step in (0, 1, 2):  # validation's own progress: its last turn, with ETA, before its summary line
        done = [ln for ln in log.splitlines() if ln.startswith(f"validation @ step {step} ") and ", ETA " in ln]
        assert len(done) == 1 and " running=0" in done[0], (step, log[-3000:])
        assert log.index(done[0]) < log.index(f"validation @ step {step}: success")


def test_console_has_no_library_output_and_a_short_config(finished):
    run, console = finished
    for text in ("Warning", "warn(", "Loading weights", "Writing model shards", "it/s]", "resolved config:"):
        assert text not in console, (text, console[-3000:])
    start = console.index("config: ")
    assert console[start:].splitlines()[0].startswith(f"config: {run / 'config.yaml'}")
    assert console.index("run directory:") - start < 800  # a few lines, not the ~60 of the whole config


def test_console_says_the_ranks_and_the_critic_warm_up_step_by_step(finished):
    """ppo.critic_warmup_steps=1 of 2 steps: said before the run, on each step's progress line, and
    when the actor starts; one process; validation at step 0 is after SFT (SFT ran)."""
    _, console = finished
    assert "ranks: 1 (one process)" in console
    assert "critic warm-up: RL step 1 trains the critic only; the actor updates from step 2 on" in console
    lines = console.splitlines()
    (first,) = [ln for ln in lines if ln.startswith("PPO 1/2 [")]
    (second,) = [ln for ln in lines if ln.startswith("PPO 2/2 [")]
    assert first.endswith("actor=critic-warm-up(1/1)") and second.endswith("actor=updated"), (first, second)
    assert "RL step 2: the critic's warm-up is over (1 step(s)); the actor updates from this step on" in console
    assert "at RL step 0 (after SFT)" in console and "warning: ppo.critic_warmup_steps" not in console


def test_plots_of_the_run(finished):
    from vagent.runs.plots import RATE_LIMITS, curves_figure, val_figure

    run, console = finished
    records = read_metrics(run / "metrics.jsonl")
    assert {p.name for p in (run / "plots").iterdir()} == {"curves.png", "val.png"}
    assert f"curves: {run / 'plots'}" in console  # the summary names them (a run with log.plots false does not)
    axes = {ax.get_title(): ax for ax in curves_figure(records).axes if ax.get_title()}
    assert axes["validation success rate (greedy)"].get_ylim() == RATE_LIMITS
    assert "starts at step 2" in axes["policy loss"].texts[0].get_text()  # ppo.critic_warmup_steps=1
    legend = [t.get_text() for t in val_figure(records).axes[0].get_legend().get_texts()]
    assert legend == ["frozenlake"]


def test_resume_of_a_finished_run_changes_nothing(finished):
    run, _ = finished

    def digest() -> dict[str, str]:
        return {str(p.relative_to(run)): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in sorted(run.rglob("*")) if p.is_file()}

    before = digest()
    again = _train("--resume", str(run), cwd=run.parent)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "is finished" in again.stdout and "nothing changed" in again.stdout
    assert digest() == before  # summary.json, metrics.jsonl, train.log, checkpoints: byte for byte
