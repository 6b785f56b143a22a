"""The learning-curve figures: fixed 0-1 axes for rates, one line per series, late starts explained."""

from __future__ import annotations

import re
from pathlib import Path

from vagent.runs.metrics import MetricsLogger, read_metrics
from vagent.runs.plots import RATE_LIMITS, curves_figure, plot_run, val_figure


def _records(tmp_path, envs=("frozenlake",), warmup=2, steps=5):
    """Records as a PPO run writes them: validation at 0..N, updates 1..N, the actor after the warm-up."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    log = MetricsLogger(tmp_path, tensorboard=False)
    for s in range(1, 4):
        log.log(s, {"sft/loss": 3.0 - s}, phase="sft")

    def val(s):
        per_env = {f"val/{e}/success_rate": 0.14 + 0.001 * s * (i + 1) for i, e in enumerate(envs)}
        log.log(s, {"val/success_rate": sum(per_env.values()) / len(envs), **per_env})

    val(0)
    for s in range(1, steps + 1):
        m = {"rollout/episodes": 4.0, "rollout/success_rate": 0.1 + 0.01 * s, "rollout/format_accuracy": 0.9,
             "reward/mean": s / 5, "loss/value": 1.0 / s, "actor/updated": float(s > warmup)}
        if s > warmup:
            m.update({"loss/policy": -0.1 * s, "actor/entropy": 2.0})
        log.log(s, m)
        val(s)
    return read_metrics(tmp_path / "metrics.jsonl")


def _axes(fig):
    return {ax.get_title(): ax for ax in fig.axes if ax.get_title()}


def test_rates_use_a_fixed_0_1_axis(tmp_path):
    axes = _axes(curves_figure(_records(tmp_path)))
    for title in ("validation success rate (greedy)", "training success rate (sampled)", "format accuracy"):
        assert axes[title].get_ylim() == RATE_LIMITS, title  # the data span 0.14-0.155 / 0.11-0.15 / 0.9
    assert RATE_LIMITS[0] <= 0 and RATE_LIMITS[1] >= 1
    assert axes["value loss"].get_ylim()[1] < 1.1  # other metrics autoscale
    xs = axes["validation success rate (greedy)"].lines[0].get_xdata()
    assert list(xs) == [0, 1, 2, 3, 4, 5] and list(axes["mean episode reward"].lines[0].get_xdata()) == [1, 2, 3, 4, 5]


def test_val_plot_has_one_line_per_series(tmp_path):
    one = val_figure(_records(tmp_path / "one"))
    labels = [t.get_text() for t in one.axes[0].get_legend().get_texts()]
    assert labels == ["frozenlake"]  # one env: no second, identical "all envs" line hiding it
    assert one.axes[0].get_ylim() == RATE_LIMITS
    two = val_figure(_records(tmp_path / "two", envs=("frozenlake", "navigation")))
    labels = [t.get_text() for t in two.axes[0].get_legend().get_texts()]
    assert labels == ["frozenlake", "navigation", "all envs (mean over episodes)"]
    assert len(set(labels)) == len(labels) == len(two.axes[0].lines)


def test_curves_starting_after_the_critic_warmup_say_so(tmp_path):
    axes = _axes(curves_figure(_records(tmp_path, warmup=2)))
    for title in ("policy loss", "entropy"):
        notes = [t.get_text() for t in axes[title].texts]
        assert notes and "starts at step 3" in notes[0] and "steps 1-2 trained the critic only" in notes[0], notes
        assert list(axes[title].lines[0].get_xdata()) == [3, 4, 5]
    for title in ("value loss", "mean episode reward", "validation success rate (greedy)"):
        assert not axes[title].texts, title
    assert not _axes(curves_figure(_records(tmp_path / "no-warmup", warmup=0)))["policy loss"].texts


def test_plot_run_writes_both_files(tmp_path):
    _records(tmp_path)
    files = plot_run(tmp_path / "metrics.jsonl", tmp_path / "plots")
    assert [f.name for f in files] == ["curves.png", "val.png"] and all(f.stat().st_size > 1000 for f in files)


def test_plots_are_current_until_the_metrics_are_written_again(tmp_path):
    from vagent.runs.plots import plots_current

    _records(tmp_path)
    metrics, plots = tmp_path / "metrics.jsonl", tmp_path / "plots"
    assert not plots_current(metrics, plots)  # never drawn
    plot_run(metrics, plots)
    assert plots_current(metrics, plots)  # the end of a run that plotted at its last step draws nothing again
    with metrics.open("a") as f:
        f.write('{"phase": "rl", "step": 9, "reward/mean": 0.5}\n')
    assert not plots_current(metrics, plots)
    plot_run(metrics, plots)
    assert plots_current(metrics, plots)


def guide_metrics() -> list[str]:
    """The metrics docs/training.md "Reading the curves" tells users to read, in its order."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "training.md").read_text()
    section = text.split("## Reading the curves", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1] for line in section.splitlines() if line.startswith("| `")]
    return [m for cell in rows for m in re.findall(r"`([a-z_]+/[a-z_/]+)`", cell)]


def test_curves_carry_the_metrics_the_guide_names_in_its_order(tmp_path):
    guide = guide_metrics()
    assert len(guide) == 7 and guide[0] == "val/success_rate"
    log = MetricsLogger(tmp_path, tensorboard=False)
    for s in range(0, 4):
        log.log(s, {"val/success_rate": 0.1 * s, "val/format_accuracy": 0.9})
        if s:
            log.log(s, {"rollout/episodes": 4.0, "rollout/success_rate": 0.2, "rollout/format_accuracy": 0.95,
                        "rollout/return_mean": 0.3 * s, "reward/mean": 0.3 * s, "actor/kl_ref": 0.01 * s,
                        "critic/explained_variance": -0.05, "loss/policy": -0.1, "actor/updated": 1.0})
    log.close()
    fig = curves_figure(read_metrics(tmp_path / "metrics.jsonl"))
    names = [ax.get_ylabel() for ax in fig.axes if ax.get_title()]  # each panel's y axis names its metric
    assert names[:len(guide)] == guide, names
