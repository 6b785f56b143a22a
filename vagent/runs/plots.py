"""Learning-curve plots from ``metrics.jsonl``, redrawn as the run goes (matplotlib).

``plots/curves.png`` holds one panel per key metric (those of :data:`PANELS` present in the
file; first the metrics docs/training.md "Reading the curves" tells users to read, in its order;
each panel's y axis names its metric); ``plots/val.png`` the validation success rate per env
(one line per env, plus the mean over all validation episodes when there are several envs). Steps follow the run's convention
(docs/metrics.md, "Steps"): training curves run 1..N (after k updates), validation 0..N (0 = the
policy after SFT, before RL); the SFT phase gets its own panel (``sft/loss``) against SFT steps.
Rates (success, format accuracy) are drawn on a fixed 0-1 axis, so a drop of 0.02 looks like
one. A curve that starts after the others (the actor's losses during the critic warm-up, when
only the critic trains) says so in its panel.

:func:`curves_figure` and :func:`val_figure` build the figures (tests inspect them);
:func:`plot_run` writes them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vagent.runs.metrics import read_metrics

PANELS = (
    # docs/training.md "Reading the curves", in its order (tests/runs/test_plots.py reads the guide)
    ("val/success_rate", "validation success rate (greedy)"),
    ("val/format_accuracy", "validation format accuracy (greedy)"),
    ("rollout/format_accuracy", "format accuracy"),
    ("rollout/return_mean", "mean episode return (sampled)"),
    ("rollout/success_rate", "training success rate (sampled)"),
    ("actor/kl_ref", "KL to the reference policy (per token)"),
    ("critic/explained_variance", "critic explained variance"),
    # then the rest
    ("reward/mean", "mean episode reward"),
    ("loss/policy", "policy loss"),
    ("loss/value", "value loss"),
    ("actor/entropy", "entropy"),
    ("loss/approx_kl", "approx KL (old -> new)"),
    ("mismatch/kl", "engine/trainer mismatch KL (k3, per token)"),
    ("mismatch/behaviour_proximal_kl", "behaviour vs proximal KL (overlap 1)"),
    ("sync/canary_max_abs_diff", "weight-push canary max |log-prob gap|"),
    ("sft/loss", "SFT loss"),
)

#: the y range of rates: 0-1 with a small margin, so points at 0 and 1 stay visible
RATE_LIMITS = (-0.02, 1.02)


def is_rate(key: str) -> bool:
    """Metrics that are fractions in [0, 1]: success rates and format accuracies."""
    return key.endswith(("success_rate", "format_accuracy"))


def _series(records: list[dict], key: str, phase: str) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for r in records:
        v = r.get(key)
        if r.get("phase") == phase and isinstance(v, (int, float)) and not isinstance(v, bool):
            xs.append(r["step"])
            ys.append(float(v))
    return xs, ys


def late_start_note(records: list[dict], key: str, xs: list[int]) -> str | None:
    """Why an RL training curve starts after the first training step, or None if it does not."""
    train_steps = [r["step"] for r in records if r.get("phase") == "rl" and "rollout/episodes" in r]
    if not xs or not train_steps or key.startswith("val/") or xs[0] <= min(train_steps):
        return None
    warmup = [r["step"] for r in records if r.get("phase") == "rl" and r.get("actor/updated") == 0.0]
    if warmup and max(warmup) < xs[0]:
        return (f"starts at step {xs[0]}: steps {min(warmup)}-{max(warmup)} trained the critic only\n"
                "(ppo.critic_warmup_steps)")
    return f"starts at step {xs[0]} (not logged before)"


def curves_figure(records: list[dict]) -> Any | None:
    """One panel per metric of :data:`PANELS` found in ``records``; None if there is none."""
    from matplotlib.figure import Figure

    panels = []
    for key, title in PANELS:
        phase = "sft" if key.startswith("sft/") else "rl"
        xs, ys = _series(records, key, phase)
        if xs:
            panels.append((key, title, phase, xs, ys))
    if not panels:
        return None
    cols = 4
    rows = (len(panels) + cols - 1) // cols
    fig = Figure(figsize=(4.0 * cols, 3.0 * rows))
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.axis("off")
    for ax, (key, title, phase, xs, ys) in zip(axes.flat, panels):
        ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, markersize=3)
        ax.set_title(title, fontsize=9)
        ax.set_ylabel(key, fontsize=8)  # the name the guide, TensorBoard and metrics.jsonl use
        if phase == "sft":
            ax.set_xlabel("SFT step (after k updates)", fontsize=8)
        elif key.startswith("val/"):
            ax.set_xlabel("RL step (0 = after SFT, before RL)", fontsize=8)
        else:
            ax.set_xlabel("RL step (after k updates)", fontsize=8)
        if is_rate(key):
            ax.set_ylim(*RATE_LIMITS)
        note = late_start_note(records, key, xs) if phase == "rl" else None
        if note:
            ax.text(0.02, 0.03, note, transform=ax.transAxes, fontsize=6, color="0.35", va="bottom")
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    # fixed margins in inches (the panels' labels have fixed font sizes): tight_layout measures every
    # text artist and took 40% of the figure's time (0.55 of 1.32 s), for the same layout
    w, h = fig.get_size_inches()
    fig.subplots_adjust(left=0.8 / w, right=1 - 0.15 / w, bottom=0.63 / h, top=1 - 0.45 / h, wspace=0.32, hspace=0.5)
    return fig


def val_figure(records: list[dict]) -> Any | None:
    """Validation success per env, one line each (and the mean over all val episodes when there
    are several envs); None without validation records."""
    from matplotlib.figure import Figure

    per_env = sorted({k for r in records for k in r
                      if k.startswith("val/") and k.endswith("/success_rate") and k.count("/") == 2})
    lines = [(k, k.split("/")[1]) for k in per_env]
    if len(per_env) != 1:  # one env: its line is the mean over all validation episodes
        lines.append(("val/success_rate", "all envs (mean over episodes)"))
    lines = [(k, label, *_series(records, k, "rl")) for k, label in lines]
    lines = [line for line in lines if line[2]]
    if not lines:
        return None
    fig = Figure(figsize=(5.5, 3.5))
    ax = fig.subplots()
    for _, label, xs, ys in lines:
        ax.plot(xs, ys, marker="o", label=label)
    ax.set_title("validation success rate (greedy)", fontsize=9)
    ax.set_xlabel("RL step (0 = after SFT, before RL)")
    ax.set_ylabel("success rate")
    ax.set_ylim(*RATE_LIMITS)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def plots_current(metrics_path: str | Path, out_dir: str | Path) -> bool:
    """Whether ``out_dir/curves.png`` was drawn after the last write of ``metrics_path`` (then a
    redraw would draw the same figure: the end of a run whose last step already plotted)."""
    curves = Path(out_dir) / "curves.png"
    try:
        return curves.stat().st_mtime_ns > Path(metrics_path).stat().st_mtime_ns  # equal: a coarse clock tick, redraw
    except FileNotFoundError:
        return False


def plot_run(metrics_path: str | Path, out_dir: str | Path) -> list[Path]:
    """Draw the plots of one run; returns the files written (none if there is nothing to draw)."""
    records = read_metrics(metrics_path)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, fig in (("curves.png", curves_figure(records)), ("val.png", val_figure(records))):
        if fig is not None:
            fig.savefig(out / name, dpi=90)
            written.append(out / name)
    return written
