"""``vagent sweep report DIR``: per-metric tables over seeds, paired differences, curves with bands.

Reads ``DIR/sweep.json`` (rows, baseline, trials) and each trial's run directory
(``trials/<row>/seed_<k>/<run>/``: ``metrics.jsonl``, ``summary.json``). Only finished trials
(those with ``summary.json``) count; the report lists the others as missing. Writes into
``DIR/report/`` (or ``--out``):

    report.md                   a table per metric: mean +- standard error over seeds, the per-seed
                                values, and the paired difference to the baseline row with its 95%
                                t-interval (vagent.sweep.stats)
    report.json                 the same numbers, unrounded
    curves_<metric>.png         each row's validation curve: mean over seeds, band +- one standard error

Metrics (each a number per trial):

| key | from the run |
|---|---|
| ``val_success_final`` | ``val/success_rate`` of the last validation |
| ``val_success_best`` | the highest ``val/success_rate`` of any validation (step 0 included) |
| ``val_return_final`` | ``val/return`` of the last validation |
| ``val_format_final`` | ``val/format_accuracy`` of the last validation |
| ``wall_time_min`` | ``summary.json``'s ``wall_time_s`` / 60 (of the process that finished the run) |
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from vagent.sweep.stats import PairedDiff, Summary, paired_difference, summarize

#: (key, title) of the report's tables, in order
METRICS = (
    ("val_success_final", "final validation success rate"),
    ("val_success_best", "best validation success rate"),
    ("val_return_final", "final validation return"),
    ("val_format_final", "final validation format rate"),
    ("wall_time_min", "wall time (minutes)"),
)
#: validation curves drawn (metrics.jsonl keys)
CURVES = ("val/success_rate", "val/return", "val/format_accuracy")


def curve_file(key: str) -> str:
    """The file a validation curve is drawn to (``val/success_rate`` -> ``curves_success_rate.png``)."""
    return f"curves_{key.split('/')[-1]}.png"


class ReportError(ValueError):
    """The directory is not a sweep directory, or the baseline is not a row; the message says what to pass."""


@dataclass(frozen=True)
class TrialResult:
    """One finished trial's numbers (``METRICS`` keys) and validation curves (key -> [(step, value)])."""

    row: str
    seed: int
    values: dict
    curves: dict


@dataclass
class SweepResults:
    """Every finished trial of a sweep directory, its rows in order, and the unfinished trials' ids."""

    rows: list[str]
    baseline: str
    trials: list[TrialResult]
    missing: list[str] = field(default_factory=list)

    def by_seed(self, row: str, key: str) -> dict[int, float]:
        return {t.seed: t.values[key] for t in self.trials if t.row == row and key in t.values}


def trial_result(row: str, seed: int, run_dir: Path) -> TrialResult | None:
    """The numbers of a finished run directory (None while it has no ``summary.json``)."""
    from vagent.runs import read_metrics

    if not (run_dir / "summary.json").is_file():
        return None
    summary = json.loads((run_dir / "summary.json").read_text())
    val = [r for r in read_metrics(run_dir / "metrics.jsonl") if r.get("phase") == "rl" and "val/success_rate" in r]
    values: dict[str, float] = {"wall_time_min": float(summary["wall_time_s"]) / 60.0}
    if val:
        values["val_success_final"] = float(val[-1]["val/success_rate"])
        values["val_success_best"] = max(float(r["val/success_rate"]) for r in val)
        for key, name in (("val_return_final", "val/return"), ("val_format_final", "val/format_accuracy")):
            if name in val[-1]:
                values[key] = float(val[-1][name])
    curves = {k: [(int(r["step"]), float(r[k])) for r in val if k in r] for k in CURVES}
    return TrialResult(row, seed, values, curves)


def load_results(sweep_dir: Path) -> SweepResults:
    """Read a sweep directory (``sweep.json`` + the trials' run directories)."""
    from vagent.sweep.runner import trial_run_dirs

    meta = sweep_dir / "sweep.json"
    if not meta.is_file():
        raise ReportError(f"{sweep_dir} has no sweep.json: pass the directory vagent sweep printed "
                          "(<out_dir>/<name> of the sweep file, or its --out).")
    data = json.loads(meta.read_text())
    trials, missing = [], []
    for t in data["trials"]:
        runs = trial_run_dirs(sweep_dir / "trials" / t["id"])
        result = trial_result(t["row"], int(t["seed"]), runs[-1]) if runs else None
        (trials.append(result) if result is not None else missing.append(t["id"]))
    return SweepResults([r["name"] for r in data["rows"]], data["baseline"], trials, missing)


def tables(results: SweepResults, baseline: str) -> dict:
    """{metric: {row: {"summary": Summary, "diff": PairedDiff | None, "seeds": {seed: value}}}}."""
    out: dict = {}
    for key, _ in METRICS:
        base = results.by_seed(baseline, key)
        out[key] = {}
        for row in results.rows:
            vals = results.by_seed(row, key)
            out[key][row] = {"summary": summarize([vals[s] for s in sorted(vals)]),
                             "diff": None if row == baseline else paired_difference(vals, base),
                             "seeds": vals}
    return out


def _f(x: float, digits: int) -> str:
    return "n/a" if math.isnan(x) else f"{x:.{digits}f}"


def _mean_se(s: Summary, digits: int) -> str:
    if s.n == 0:
        return "-"
    return _f(s.mean, digits) if s.n < 2 else f"{_f(s.mean, digits)} +- {_f(s.se, digits)}"


def _diff(d: PairedDiff | None, digits: int) -> tuple[str, str]:
    if d is None:
        return "(baseline)", ""
    if d.n == 0:
        return "-", ""
    sign = "+" if d.mean >= 0 else ""
    ci = "" if d.n < 2 else f"[{_f(d.lo, digits)}, {_f(d.hi, digits)}]"
    return f"{sign}{_f(d.mean, digits)}", ci


def markdown(results: SweepResults, baseline: str, name: str = "") -> str:
    """The report as Markdown: one table per metric."""
    tab = tables(results, baseline)
    lines = [f"# Sweep report{': ' + name if name else ''}", "",
             f"{len(results.trials)} finished trials over {len(results.rows)} rows; baseline row: `{baseline}`. "
             "Values are mean +- "
             "standard error over seeds; the difference to the baseline is paired by seed (the seeds both rows "
             "finished) with its 95% t-interval.", ""]
    if results.missing:
        lines += [f"Not finished (left out): {', '.join(results.missing)}.", ""]
    for key, title in METRICS:
        digits = 1 if key == "wall_time_min" else 3
        lines += [f"## {title} (`{key}`)", "",
                  "| row | seeds | mean +- SE | per seed | diff vs baseline | 95% CI |", "|---|---|---|---|---|---|"]
        for row in results.rows:
            cell = tab[key][row]
            per_seed = " / ".join(f"{s}: {_f(v, digits)}" for s, v in sorted(cell["seeds"].items()))
            d, ci = _diff(cell["diff"], digits)
            lines.append(f"| `{row}` | {cell['summary'].n} | {_mean_se(cell['summary'], digits)} | {per_seed or '-'} "
                         f"| {d} | {ci} |")
        lines.append("")
    lines += ["## Validation curves", ""] + [f"![{k}]({curve_file(k)})" for k in CURVES] + [""]
    return "\n".join(lines)


def _nan_to_none(x: float) -> float | None:
    return None if isinstance(x, float) and math.isnan(x) else x


def as_json(results: SweepResults, baseline: str) -> dict:
    tab = tables(results, baseline)
    out: dict = {"baseline": baseline, "rows": results.rows, "missing": results.missing, "metrics": {}}
    for key, _ in METRICS:
        out["metrics"][key] = {}
        for row, cell in tab[key].items():
            s, d = cell["summary"], cell["diff"]
            out["metrics"][key][row] = {
                "n": s.n, "mean": _nan_to_none(s.mean), "se": _nan_to_none(s.se),
                "seeds": {str(k): v for k, v in sorted(cell["seeds"].items())},
                "diff": None if d is None else {"n": d.n, "mean": _nan_to_none(d.mean), "se": _nan_to_none(d.se),
                                                "lo": _nan_to_none(d.lo), "hi": _nan_to_none(d.hi)},
            }
    return out


def curve_bands(results: SweepResults, row: str, key: str) -> list[tuple[int, Summary]]:
    """(step, Summary over the seeds that validated at that step) of one row's curve."""
    points: dict[int, list[float]] = {}
    for t in results.trials:
        if t.row == row:
            for step, v in t.curves.get(key, []):
                points.setdefault(step, []).append(v)
    return [(step, summarize(vals)) for step, vals in sorted(points.items())]


def plot_curves(results: SweepResults, out: Path) -> list[Path]:
    """One PNG per validation metric: each row's mean curve with a +- SE band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for key in CURVES:
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for row in results.rows:
            pts = curve_bands(results, row, key)
            if not pts:
                continue
            steps = [s for s, _ in pts]
            mean = [p.mean for _, p in pts]
            se = [0.0 if math.isnan(p.se) else p.se for _, p in pts]
            (line,) = ax.plot(steps, mean, marker="o", ms=3, label=f"{row} (n={max(p.n for _, p in pts)})")
            ax.fill_between(steps, [m - e for m, e in zip(mean, se)], [m + e for m, e in zip(mean, se)],
                            color=line.get_color(), alpha=0.2)
        ax.set_xlabel("RL step")
        ax.set_ylabel(key)
        ax.set_title(f"{key}: mean over seeds +- standard error")
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=7)
        path = out / curve_file(key)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def write_report(sweep_dir: Path, out: Path | None = None, baseline: str | None = None) -> Path:
    """Write report.md, report.json and the curve PNGs; returns the report folder."""
    results = load_results(sweep_dir)
    baseline = baseline or results.baseline
    if baseline not in results.rows:
        raise ReportError(f"baseline {baseline!r} is not a row of {sweep_dir}; rows: {', '.join(results.rows)}.")
    out = out or sweep_dir / "report"
    out.mkdir(parents=True, exist_ok=True)
    name = json.loads((sweep_dir / "sweep.json").read_text()).get("name", "")
    (out / "report.md").write_text(markdown(results, baseline, name))
    (out / "report.json").write_text(json.dumps(as_json(results, baseline), indent=1) + "\n")
    plot_curves(results, out)
    return out
