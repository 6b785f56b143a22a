"""What the viewer shows for a sweep directory (``vagent sweep``; docs/sweep.md).

A sweep directory (``sweep.json`` + ``trials/<row>/seed_<k>/<run>/``) becomes one document,
``index()``: the report's tables as ``vagent sweep report`` computes them (``vagent.sweep.report``:
``load_results`` and ``as_json``, the numbers of ``report.json``, computed from the trials as they
are now, so nothing needs to be on disk), the validation curves' PNGs (``plot_curves``, drawn
from the same results) and every trial with its status:

| status | the trial's folder |
|---|---|
| ``finished``    | a run directory with ``summary.json`` (counted in the tables) |
| ``failed``      | a run directory without ``summary.json`` whose last event in ``events.jsonl`` is an error |
| ``unfinished``  | a run directory without ``summary.json`` (running, or stopped before its end) |
| ``not started`` | no run directory yet |

A trial's run directory opens in the ordinary run viewer (``trial(trial_id)``: a
``vagent.viewer.data.RunSource``); the server puts it under ``/trial/<row>/seed_<k>/``.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Literal

from vagent.viewer.data import RunSource, ViewerError


def is_sweep_dir(path: Path) -> bool:
    return (path / "sweep.json").is_file()


def _read_jsonl(path: Path) -> list[dict]:
    """The records of a JSONL file; a line being written (torn) is skipped."""
    out = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


class SweepSource:
    """A sweep directory: the report's numbers, curves and trials, and each trial's run viewer."""

    kind: Literal["sweep"] = "sweep"

    def __init__(self, root: Path, baseline: str | None = None):
        self.root = root
        self.baseline = baseline
        self._meta = self._read_meta()
        self._trials = {t["id"]: t for t in self._meta["trials"]}
        self._runs: dict[Path, RunSource] = {}
        self._png_key: str | None = None
        self._pngs: dict[str, bytes] = {}

    @property
    def title(self) -> str:
        return str(self._meta.get("name") or self.root.name)

    def _read_meta(self) -> dict:
        try:
            meta = json.loads((self.root / "sweep.json").read_text())
            if not isinstance(meta.get("trials"), list) or not isinstance(meta.get("rows"), list):
                raise KeyError("trials or rows")
        except (OSError, json.JSONDecodeError, KeyError) as exc:
            raise ViewerError(f"{self.root / 'sweep.json'} is not a sweep.json that vagent sweep writes ({exc}); "
                              "pass a sweep directory (<out_dir>/<name> of the sweep file)") from exc
        return meta

    # ------------------------------------------------------------------ the report
    def _results(self):
        from vagent.sweep.report import load_results

        try:
            results = load_results(self.root)
        except (OSError, ValueError, KeyError) as exc:  # a summary.json cut mid-write, a bad sweep.json
            raise ViewerError(f"cannot read the sweep's results in {self.root}: {type(exc).__name__}: {exc}") from exc
        baseline = self.baseline or results.baseline
        if baseline not in results.rows:
            raise ViewerError(f"baseline {baseline!r} is not a row of {self.root}; rows: {', '.join(results.rows)}.")
        return results, baseline

    def index(self) -> dict:
        """The sweep page's document (see the module docstring); ``metrics`` is ``report.json``'s."""
        from vagent.sweep.report import CURVES, METRICS, as_json, curve_file

        self._meta = self._read_meta()  # read again: a sweep file given more seeds adds trials
        self._trials = {t["id"]: t for t in self._meta["trials"]}
        results, baseline = self._results()
        report = as_json(results, baseline)
        finals = {(t.row, t.seed): t.values.get("val_success_final") for t in results.trials}
        events = self._last_events()
        return {
            "kind": "sweep", "title": self.title, "path": str(self.root),
            "baseline": baseline, "rows": report["rows"], "missing": report["missing"],
            "n_finished": len(results.trials), "n_trials": len(self._trials),
            "metrics": [{"key": k, "title": title, "digits": 1 if k == "wall_time_min" else 3,
                         "rows": report["metrics"][k]} for k, title in METRICS],
            "curves": [{"key": k, "file": f"curves/{curve_file(k)}"} for k in CURVES],
            "trials": [self._trial_entry(t, finals, events) for t in self._meta["trials"]],
        }

    def _trial_entry(self, t: dict, finals: dict, events: dict[str, dict]) -> dict:
        from vagent.sweep.runner import trial_run_dirs

        runs = trial_run_dirs(self.root / "trials" / t["id"])
        run = runs[-1] if runs else None
        last = events.get(t["id"], {})
        if run is None:
            status = "not started"
        elif (run / "summary.json").is_file():
            status = "finished"
        else:
            status = "failed" if last.get("event") == "error" else "unfinished"
        return {"id": t["id"], "row": t["row"], "seed": t["seed"], "status": status,
                "run_dir": str(run) if run else None, "viewable": run is not None,
                "val_success_final": finals.get((t["row"], int(t["seed"]))),
                "error": last.get("error") if status == "failed" else None}

    def _last_events(self) -> dict[str, dict]:
        """Each trial's last event in ``events.jsonl`` (start, resume, skip, finish or error)."""
        return {e["trial"]: e for e in _read_jsonl(self.root / "events.jsonl") if "trial" in e}

    # ------------------------------------------------------------------ the curves
    def curve_png(self, name: str) -> bytes:
        """``curves_<metric>.png`` as ``vagent sweep report`` draws it, from the trials as they are
        now (drawn again when a trial's validation curve changed)."""
        from vagent.sweep.report import CURVES, curve_file, plot_curves

        names = {curve_file(k) for k in CURVES}
        if name not in names:
            raise ViewerError(f"no curve {name!r}; curves: {', '.join(sorted(names))}")
        results, _ = self._results()
        key = json.dumps([results.rows, [[t.row, t.seed, t.curves] for t in results.trials]])
        if key != self._png_key:
            with tempfile.TemporaryDirectory(prefix="vagent-view-curves-") as tmp:
                paths = plot_curves(results, Path(tmp))
                self._pngs = {p.name: p.read_bytes() for p in paths}
            self._png_key = key
        return self._pngs[name]

    # ------------------------------------------------------------------ the trials' run viewers
    def trial(self, trial_id: str, fresh: bool = False) -> RunSource:
        """The run viewer's source of a trial's run directory. ``trial_id`` must be one of
        ``sweep.json``'s trial ids (``<row>/seed_<k>``), so no path outside the sweep is reachable.
        fresh: read the run directory again (its dumps may have grown since)."""
        from vagent.sweep.runner import trial_run_dirs

        if trial_id not in self._trials:
            raise ViewerError(f"no trial {trial_id!r} in {self.root / 'sweep.json'} (trial ids look like "
                              f"{next(iter(self._trials), '<row>/seed_0')!r})")
        runs = trial_run_dirs(self.root / "trials" / trial_id)
        if not runs:
            raise ViewerError(f"trial {trial_id!r} has not started: no run directory in "
                              f"{self.root / 'trials' / trial_id}")
        if fresh or runs[-1] not in self._runs:
            self._runs[runs[-1]] = RunSource(runs[-1])
        return self._runs[runs[-1]]


__all__ = ["SweepSource", "is_sweep_dir"]
