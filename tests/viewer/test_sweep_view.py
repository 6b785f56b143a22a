"""``vagent view SWEEP_DIR``: a sweep's report, curves and trials, each trial's run a click away.

On the synthetic sweep directory of tests/sweep/test_report.py (three rows x three seeds, one
trial killed before its summary.json), with a few more half-written trials (a run directory with
an empty metrics.jsonl, a finished run with an empty metrics.jsonl, a trial not started, a trial
whose last event is an error) and the rollouts of a two-step run (tests/viewer/_run.py) in the
baseline's seed 0:

- over HTTP on loopback, the page's JSON carries the numbers of ``vagent.sweep.report`` (means,
  standard errors, paired differences and their intervals), the curves are PNGs, a trial's run
  viewer answers under ``/trial/<row>/seed_<k>/``, and bad or escaping paths get a 404 with a JSON
  error;
- in chromium: the tables (baseline row, an interval), a curve image, a trial link into its run
  viewer (episodes listed) and the link back;
- ``vagent view SWEEP_DIR --out FILE`` writes a page that shows the same table from the file alone.
"""

from __future__ import annotations

import http.client
import json
import math
import shutil
import urllib.request
from pathlib import Path

import pytest

from tests.sweep.test_report import SUCCESS, write_synthetic_trials
from tests.viewer._run import make_run
from tests.viewer._browser import CHROMIUM, sync_playwright
from vagent.cli import build_parser
from vagent.sweep.report import as_json, load_results

# trials beyond test_report's: (row, seed) -> what its folder holds
EXTRA = {("new", 3): "run dir, empty metrics.jsonl, no summary.json", ("base", 3): "nothing",
         ("empty", 0): "summary.json, empty metrics.jsonl"}


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    """The synthetic sweep directory (module docstring)."""
    root = tmp_path_factory.mktemp("sweepview") / "sweep"
    trials = write_synthetic_trials(root)
    trials += [{"id": f"{row}/seed_{seed}", "row": row, "seed": seed, "config": {}} for row, seed in EXTRA]
    for row, seed in (("new", 3), ("empty", 0)):
        run = root / "trials" / row / f"seed_{seed}" / f"{row}-s{seed}-20260101-000000"
        run.mkdir(parents=True)
        (run / "config.yaml").write_text(f"seed: {seed}\n")
        (run / "metrics.jsonl").write_text("")
    (run / "summary.json").write_text(json.dumps({"run_dir": str(run), "wall_time_s": 60.0}))
    (root / "events.jsonl").write_text(json.dumps({"trial": "half/seed_2", "event": "start"}) + "\n"
                                       + json.dumps({"trial": "half/seed_2", "event": "error",
                                                     "error": "RuntimeError: out of memory"}) + "\n{\"tri")
    (root / "sweep.json").write_text(json.dumps({
        "name": "synthetic", "baseline": "base", "seeds": [0, 1, 2, 3], "trials": trials,
        "rows": [{"name": r, "values": {}} for r in [*SUCCESS, "empty"]]}))
    # the baseline's seed 0 gets a run's episode dumps (its metrics.jsonl and summary.json stay)
    scratch = tmp_path_factory.mktemp("scratch") / "run"
    make_run(scratch, steps=2, n_episodes=3)
    shutil.copytree(scratch / "rollouts", _run_dir(root, "base/seed_0") / "rollouts")
    return root


def _run_dir(root: Path, trial_id: str) -> Path:
    return next((root / "trials" / trial_id).iterdir())


@pytest.fixture(scope="module")
def served(sweep):
    from vagent.viewer.server import serve_in_thread
    from vagent.viewer.sweep import SweepSource

    server, url = serve_in_thread(SweepSource(sweep), port=0)
    yield url
    server.shutdown()
    server.server_close()


def get(url: str) -> tuple[int, bytes, str]:
    try:
        with urllib.request.urlopen(url, timeout=300) as r:
            return r.status, r.read(), r.headers["Content-Type"]
    except urllib.error.HTTPError as e:
        return e.code, e.read(), e.headers["Content-Type"]


def raw_get(base: str, path: str) -> tuple[int, dict, str | None]:
    """GET ``path`` exactly as written (no client-side normalising of ``..``)."""
    host, port = base.removeprefix("http://").rstrip("/").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=300)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        body = r.read()
        return r.status, (json.loads(body) if r.getheader("Content-Type") == "application/json" else {}), \
            r.getheader("Location")
    finally:
        conn.close()


def test_sweep_json_has_the_reports_numbers(sweep, served):
    code, body, ctype = get(served + "api/sweep")
    assert code == 200 and ctype == "application/json"
    doc = json.loads(body)
    report = as_json(load_results(sweep), "base")  # what vagent sweep report writes as report.json
    assert doc["baseline"] == "base" and doc["rows"] == ["base", "new", "half", "empty"]
    assert {m["key"]: m["rows"] for m in doc["metrics"]} == report["metrics"]
    assert sorted(doc["missing"]) == sorted(report["missing"]) == ["base/seed_3", "half/seed_2", "new/seed_3"]
    final = {m["key"]: m for m in doc["metrics"]}["val_success_final"]["rows"]
    # by hand (tests/sweep/test_report.py): base 0.2, 0.4, 0.3; new - base = 0.3, 0.0, 0.3, t(2) = 4.302653
    assert final["base"]["mean"] == pytest.approx(0.3) and final["base"]["se"] == pytest.approx(0.1 / math.sqrt(3))
    assert final["new"]["diff"]["lo"] == pytest.approx(0.2 - 0.4302653)
    assert final["new"]["diff"]["hi"] == pytest.approx(0.2 + 0.4302653)
    assert final["empty"]["n"] == 0 and final["empty"]["diff"]["n"] == 0
    status = {t["id"]: t["status"] for t in doc["trials"]}
    assert status == {**{f"{r}/seed_{s}": "finished" for r in SUCCESS for s in SUCCESS[r]}, "half/seed_2": "failed",
                      "new/seed_3": "unfinished", "base/seed_3": "not started", "empty/seed_0": "finished"}
    failed = next(t for t in doc["trials"] if t["id"] == "half/seed_2")
    assert failed["error"] == "RuntimeError: out of memory" and failed["val_success_final"] is None
    assert next(t for t in doc["trials"] if t["id"] == "new/seed_2")["val_success_final"] == pytest.approx(0.6)
    for c in doc["curves"]:
        code, png, ctype = get(served + c["file"])
        assert code == 200 and ctype == "image/png" and png.startswith(b"\x89PNG")


def test_trial_run_viewer_under_its_prefix(sweep, served):
    code, html, ctype = get(served + "trial/base/seed_0/")
    assert code == 200 and ctype.startswith("text/html") and b'src="static/viewer.js"' in html
    assert get(served + "trial/base/seed_0/static/viewer.js")[0] == 200
    index = json.loads(get(served + "trial/base/seed_0/api/index")[1])
    assert index["path"] == str(_run_dir(sweep, "base/seed_0")) and index["back"]["href"] == "../../../"
    assert [g["id"] for g in index["groups"]] == ["step_000000", "step_000001", "val_000000", "val_000001"]
    eps = json.loads(get(served + "trial/base/seed_0/api/episodes?group=step_000001")[1])
    assert len(eps) == 3
    ep = json.loads(get(served + "trial/base/seed_0/api/episode?group=step_000001&i=0")[1])
    code, png, ctype = get(served + "trial/base/seed_0/files/" + ep["turns"][0]["images"][0])
    assert code == 200 and ctype == "image/png"
    # an unfinished trial opens too (its run so far); the prefix without its slash redirects
    assert json.loads(get(served + "trial/new/seed_3/api/index")[1])["groups"] == []
    assert raw_get(served, "/trial/base/seed_0")[::2] == (301, "/trial/base/seed_0/")


@pytest.mark.parametrize("path", [
    "/trial/nope/seed_0/api/index",                          # not a row
    "/trial/base/seed_9/",                                   # not a seed of the sweep
    "/trial/base/seed_3/api/index",                          # not started: no run directory
    "/trial/base/seed_0/api/episodes?group=step_000009",     # a step without dumps
    "/trial/base/",                                          # no seed
    "/nowhere",
    "/curves/report.md",
    # escapes: out of the run directory, out of the sweep, into the static folder's parent
    "/trial/base/seed_0/files/../../../../sweep.json",
    "/trial/base/seed_0/files/%2e%2e/%2e%2e/%2e%2e/%2e%2e/sweep.json",
    "/trial/base/seed_0/files//etc/passwd",
    "/trial/%2e%2e/%2e%2e/files/sweep.json",
    "/trial/..%2f..%2f..%2fetc/seed_0/",
    "/trial/../../../../etc/passwd",
    "/curves/..%2fsweep.json",
    "/static/..%2fsweep.py",
])
def test_bad_and_escaping_paths_are_404_with_a_json_error(served, path):
    code, body, _ = raw_get(served, path)
    assert code == 404 and body.get("error"), (path, code, body)


# ---------------------------------------------------------------------------- in a browser
needs_browser = pytest.mark.skipif(CHROMIUM is None or sync_playwright is None, reason="needs chromium "
                                   "(apt-get install -y chromium) and playwright (pip install playwright)")


#: what only a trial's run viewer shows (its link back to the sweep), and only the sweep page (a metric's table)
RUN_PAGE, SWEEP_PAGE = "a#back", ".metric[data-metric='val_success_final']"


def final_table(page):
    return page.locator(".metric[data-metric='val_success_final']")


@needs_browser
def test_sweep_page_tables_curves_and_trial_links(served, page):
    page.goto(served)
    page.wait_for_selector("body[data-ready='1']")
    table = final_table(page)
    base = table.locator("tr.baseline[data-row='base']")
    assert "(baseline)" in base.inner_text() and "0.300 ± 0.058" in base.inner_text()
    assert table.locator("tr[data-row='new'] td.ci").inner_text() == "[-0.230, 0.630]"
    assert table.locator("tr[data-row='new'] td.diff").inner_text() == "+0.200"
    curve = page.locator("img.curve[data-curve='val/success_rate']")
    curve.evaluate("i => i.decode()")
    assert curve.evaluate("i => i.complete && i.naturalWidth > 0")
    assert page.locator("tr.trial[data-status='failed']").count() == 1
    assert page.locator("tr.trial[data-trial='base/seed_3'] a").count() == 0  # not started: nothing to open

    # each page's readiness signal (body[data-ready]) with what only that page has: the sweep page
    # is ready too, so its own signal alone would pass before the click's navigation
    page.locator("tr.trial[data-trial='base/seed_0'] a.trial-link").click()
    page.wait_for_selector(f"body[data-ready='1'] {RUN_PAGE}")
    assert page.url.split("#")[0] == served + "trial/base/seed_0/"  # the page adds #group=...&i=...
    assert page.locator("tr.ep").count() == 3  # the first dumped step's episodes
    page.locator("tr.ep").first.click()
    page.wait_for_selector(".episode .tok.m1")
    page.locator("a#back").click()
    page.wait_for_selector(f"body[data-ready='1'] {SWEEP_PAGE}")
    assert page.url == served
    assert final_table(page).locator("tr.baseline").count() == 1


@needs_browser
def test_out_page_is_self_contained(sweep, page, tmp_path, capsys):
    out = tmp_path / "page.html"
    args = build_parser().parse_args(["view", str(sweep), "--out", str(out)])  # the command, in this process
    assert args.func(args) == 0
    assert "open it in a browser" in capsys.readouterr().out
    html = out.read_text()
    report = as_json(load_results(sweep), "base")["metrics"]["val_success_final"]
    assert json.dumps(report["new"]["diff"]["hi"]) in html and "data:image/png;base64," in html
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    page.goto(out.as_uri())
    page.wait_for_selector("body[data-ready='1']")
    assert final_table(page).locator("tr[data-row='new'] td.ci").inner_text() == "[-0.230, 0.630]"
    page.locator("img.curve").first.evaluate("i => i.decode()")
    assert page.locator("img.curve").first.evaluate("i => i.complete && i.naturalWidth > 0")
    assert str(_run_dir(sweep, "base/seed_0")) in page.locator("tr.trial[data-trial='base/seed_0']").inner_text()
    assert "vagent view <run directory>" in page.locator("#trials").inner_text()
    assert all(u.startswith(("file:", "data:")) for u in requests), requests
