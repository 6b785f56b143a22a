"""``vagent sweep report``: its numbers equal a hand computation on a synthetic sweep directory."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from vagent.sweep.report import load_results, write_report
from vagent.sweep.stats import paired_difference, summarize, t975

# row -> seed -> validation success at RL steps 0, 5, 10 (the last is "final")
SUCCESS = {
    "base": {0: [0.1, 0.3, 0.2], 1: [0.2, 0.5, 0.4], 2: [0.1, 0.2, 0.3]},
    "new": {0: [0.1, 0.6, 0.5], 1: [0.2, 0.3, 0.4], 2: [0.1, 0.7, 0.6]},
    "half": {0: [0.3, 0.3, 0.9], 1: [0.1, 0.1, 0.1]},  # seed 2 of this row is not finished
}
WALL_S = {"base": [600, 660, 630], "new": [720, 750, 690], "half": [300, 360]}


def _write_trial(root: Path, row: str, seed: int, success: list[float], wall_s: float | None) -> None:
    run = root / "trials" / row / f"seed_{seed}" / f"{row}-s{seed}-20260101-000000"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(f"seed: {seed}\n")
    recs = [{"phase": "rl", "step": 5 * i, "time": 0.0, "val/success_rate": s, "val/return": 2 * s - 0.5,
             "val/format_accuracy": 1.0 - s / 10} for i, s in enumerate(success)]
    recs.insert(1, {"phase": "rl", "step": 0, "time": 0.0, "rollout/success_rate": 0.9})  # not validation
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    if wall_s is not None:
        (run / "summary.json").write_text(json.dumps({"run_dir": str(run), "wall_time_s": wall_s}))


def write_synthetic_trials(root: Path) -> list[dict]:
    """The trials of SUCCESS / WALL_S under ``root`` (seeds 0-2 of each row; the missing ones not
    run) and a killed trial ``half/seed_2`` without summary.json; returns sweep.json's trial list."""
    trials = []
    for row, seeds in SUCCESS.items():
        for seed in range(3):
            trials.append({"id": f"{row}/seed_{seed}", "row": row, "seed": seed, "config": {}})
            if seed in seeds:
                _write_trial(root, row, seed, seeds[seed], WALL_S[row][seed])
    _write_trial(root, "half", 2, [0.0, 0.0], None)  # killed: no summary.json
    return trials


@pytest.fixture
def sweep_dir(tmp_path) -> Path:
    root = tmp_path / "sweep"
    trials = write_synthetic_trials(root)
    (root / "sweep.json").write_text(json.dumps({
        "name": "synthetic", "baseline": "base", "seeds": [0, 1, 2], "trials": trials,
        "rows": [{"name": r, "values": {}} for r in SUCCESS]}))
    return root


def _sd(xs: list[float]) -> float:
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def test_t_quantiles_are_the_tabulated_values():
    assert t975(1) == 12.706205 and t975(3) == 3.182446 and t975(30) == 2.042272
    assert abs(t975(40) - 2.021075) < 1e-5 and abs(t975(120) - 1.979930) < 1e-5 and abs(t975(10**6) - 1.959966) < 1e-5
    with pytest.raises(ValueError, match="degrees of freedom"):
        t975(0)


def test_summaries_by_hand():
    s = summarize([0.2, 0.4, 0.3])
    assert s.n == 3 and s.mean == pytest.approx(0.3) and s.se == pytest.approx(0.1 / math.sqrt(3))
    assert summarize([0.5]).n == 1 and math.isnan(summarize([0.5]).se)
    d = paired_difference({0: 0.5, 1: 0.4, 2: 0.6, 3: 9.0}, {0: 0.2, 1: 0.4, 2: 0.3})  # seed 3 unpaired
    # d = 0.3, 0.0, 0.3: mean 0.2, sd sqrt(0.03), se 0.1, t(2) = 4.302653
    assert d.n == 3 and d.mean == pytest.approx(0.2) and d.se == pytest.approx(0.1)
    assert (d.lo, d.hi) == (pytest.approx(0.2 - 0.4302653), pytest.approx(0.2 + 0.4302653))


def test_report_numbers_equal_a_hand_computation(sweep_dir):
    out = write_report(sweep_dir)
    rep = json.loads((out / "report.json").read_text())
    assert rep["baseline"] == "base" and rep["rows"] == ["base", "new", "half"]
    assert rep["missing"] == ["half/seed_2"]
    final = rep["metrics"]["val_success_final"]
    # base final 0.2, 0.4, 0.3 -> mean 0.3, se 0.1/sqrt(3)
    assert final["base"]["n"] == 3 and final["base"]["mean"] == pytest.approx(0.3)
    assert final["base"]["se"] == pytest.approx(0.1 / math.sqrt(3))
    assert final["base"]["diff"] is None
    # new final 0.5, 0.4, 0.6 -> differences 0.3, 0.0, 0.3 (mean 0.2, se 0.1, t(2) 4.302653)
    diff = final["new"]["diff"]
    assert diff["n"] == 3 and diff["mean"] == pytest.approx(0.2) and diff["se"] == pytest.approx(0.1)
    assert diff["lo"] == pytest.approx(0.2 - 4.302653 * 0.1) and diff["hi"] == pytest.approx(0.2 + 4.302653 * 0.1)
    # half: seeds 0 and 1 only (0.9, 0.1); paired against base's 0.2, 0.4 -> 0.7, -0.3 (t(1) 12.706205)
    half = final["half"]
    assert half["n"] == 2 and half["mean"] == pytest.approx(0.5) and half["se"] == pytest.approx(0.4)
    assert half["diff"]["n"] == 2 and half["diff"]["mean"] == pytest.approx(0.2)
    se = _sd([0.7, -0.3]) / math.sqrt(2)
    assert half["diff"]["se"] == pytest.approx(se) and half["diff"]["hi"] == pytest.approx(0.2 + 12.706205 * se)
    # best success: base 0.3, 0.5, 0.3; new 0.6, 0.4, 0.7
    best = rep["metrics"]["val_success_best"]
    assert best["base"]["seeds"] == {"0": 0.3, "1": 0.5, "2": 0.3}
    assert best["new"]["diff"]["mean"] == pytest.approx((0.3 - 0.1 + 0.4) / 3)
    # return = 2 * success - 0.5 and format = 1 - success / 10 of the last validation
    assert rep["metrics"]["val_return_final"]["new"]["mean"] == pytest.approx(2 * 0.5 - 0.5)
    assert rep["metrics"]["val_format_final"]["base"]["mean"] == pytest.approx(1 - 0.03)
    wall = rep["metrics"]["wall_time_min"]
    assert wall["base"]["mean"] == pytest.approx(630 / 60) and wall["new"]["diff"]["mean"] == pytest.approx(90 / 60)
    assert wall["base"]["se"] == pytest.approx(_sd([10, 11, 10.5]) / math.sqrt(3))

    md = (out / "report.md").read_text()
    assert "| `base` | 3 | 0.300 +- 0.058 | 0: 0.200 / 1: 0.400 / 2: 0.300 | (baseline) |  |" in md
    assert "| `new` | 3 | 0.500 +- 0.058 | 0: 0.500 / 1: 0.400 / 2: 0.600 | +0.200 | [-0.230, 0.630] |" in md
    assert "Not finished (left out): half/seed_2." in md
    for name in ("success_rate", "return", "format_accuracy"):
        from PIL import Image

        with Image.open(out / f"curves_{name}.png") as im:
            assert im.size[0] > 300 and im.size[1] > 200


def test_curve_bands_are_means_and_standard_errors_per_step(sweep_dir):
    from vagent.sweep.report import curve_bands

    bands = curve_bands(load_results(sweep_dir), "base", "val/success_rate")
    assert [s for s, _ in bands] == [0, 5, 10]
    assert bands[1][1].mean == pytest.approx((0.3 + 0.5 + 0.2) / 3)
    assert bands[1][1].se == pytest.approx(_sd([0.3, 0.5, 0.2]) / math.sqrt(3))


def test_report_cli_baseline_and_errors(sweep_dir, tmp_path):
    cmd = [sys.executable, "-m", "vagent.cli", "sweep", "report"]
    ok = subprocess.run(cmd + [str(sweep_dir), "--baseline", "new", "--out", str(tmp_path / "r")],
                        capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr
    rep = json.loads((tmp_path / "r" / "report.json").read_text())
    assert rep["baseline"] == "new"
    assert rep["metrics"]["val_success_final"]["base"]["diff"]["mean"] == pytest.approx(-0.2)
    bad = subprocess.run(cmd + [str(sweep_dir), "--baseline", "nope"], capture_output=True, text=True,
                         timeout=300)
    assert bad.returncode == 1
    assert "baseline 'nope' is not a row" in bad.stderr and "rows: base, new, half" in bad.stderr
    empty = subprocess.run(cmd + [str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert empty.returncode == 1 and "has no sweep.json" in empty.stderr
