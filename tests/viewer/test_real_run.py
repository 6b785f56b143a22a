"""The viewer on a real run: ``vagent train`` (PPO, two RL steps, a tiny random-weight Qwen3-VL
built without pretraining, no SFT, the rule judge on, validation at every step) and then the
page in headless chromium (as tests/viewer/test_browser.py launches it).

Checks: a dumped step's episode shows its turn's image; the page highlights exactly as many
tokens as the trained batch's loss mask holds for that episode's rows, which is the number of
tokens the policy sampled in its turns; filters change the episode list; the three validation
points are listed with their episodes; two validation points side by side pair every episode
with the one on the same env seed; two training steps (fresh seeds) say they share none.

The untrained model writes no well-formed reply, so no turn of this run is judged: the judge's
reason on the page is checked on the judged run of test_browser.py. About 1.5 minutes of CPU
(much longer on a loaded machine).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.viewer._browser import ARGS, CHROMIUM, new_page, sync_playwright
from tests.viewer.test_browser import count_text, open_episode

pytestmark = [
    pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium)"),
    pytest.mark.skipif(sync_playwright is None, reason="playwright is not installed (pip install playwright)"),
    pytest.mark.slow,
]

#: a run of seconds to a minute of CPU: untrained tiny model, 3 train / 3 val episodes of 2 short turns
TINY = ["model.tiny_pretrain_steps=0", "model.tiny_pretrain_relation_steps=0", "sft.steps=0", "steps=2",
        "envs.0.n_train=3", "envs.0.n_val=3", "val.every=1", "rollout.max_turns=2", "rollout.max_new_tokens=16",
        "log.rollouts_every=1", "log.checkpoint_every=0", "log.plot_every=0", "log.plots=false", "log.progress=false",
        "log.tensorboard=false", "reasoning_reward={judge: rule}"]


@pytest.fixture(scope="module")
def real_run(tmp_path_factory) -> Path:
    """The run directory (``VAGENT_VIEWER_REAL_RUN=DIR``: a run already made with TINY, to re-check the page)."""
    if os.environ.get("VAGENT_VIEWER_REAL_RUN"):
        return Path(os.environ["VAGENT_VIEWER_REAL_RUN"])
    tmp = tmp_path_factory.mktemp("real_run")
    cmd = [sys.executable, "-m", "vagent.cli", "train", *TINY, f"out_dir={tmp / 'runs'}", "name=view",
           f"model.cache_dir={tmp / 'cache'}"]
    done = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    [root] = sorted((tmp / "runs").glob("view*"))
    return root


@pytest.fixture(scope="module")
def page(real_run):
    from vagent.viewer.data import open_source
    from vagent.viewer.server import serve_in_thread

    server, url = serve_in_thread(open_source(real_run), port=0)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        pg = new_page(browser)
        errors: list[str] = []
        pg.on("pageerror", lambda e: errors.append(str(e)))
        pg.url_base = url
        try:
            yield pg
        finally:
            browser.close()
            server.shutdown()
            server.server_close()
    assert not errors, errors


def groups(root: Path) -> tuple[list[str], list[str]]:
    from vagent.viewer.data import open_source

    ix = open_source(root).index()
    return ([g["id"] for g in ix["groups"] if g["split"] == "train"],
            [g["id"] for g in ix["groups"] if g["split"] == "val"])


@pytest.mark.timeout(3600)  # the run: ~1.5 min of CPU alone, far longer on a shared machine
def test_real_run_steps_tokens_and_filters(real_run, page):
    from vagent.runs.tokens import read_token_rows

    from vagent.viewer.data import open_source

    train, vals = groups(real_run)
    assert len(train) == 2 and vals == ["val_000000", "val_000001", "val_000002"]
    # the step panel's engine/trainer gap: the in-process HF engine and the trainer agree to rounding
    steps = open_source(real_run).index()["steps"]
    assert all(0 <= s["mismatch_kl"] < 1e-4 and s["canary_gap"] is None for s in steps), steps
    g = train[0]
    recs = [json.loads(x) for x in (real_run / "rollouts" / f"{g}.jsonl").read_text().splitlines()]
    rows = read_token_rows(real_run / "rollouts" / f"{g}.tokens.json")["rows"]
    assert len(recs) == 3
    masks = [sum(sum(r["loss_mask"]) for r in rows if r["episode"] == i) for i in range(3)]
    assert masks == [sum(t["n_sampled_tokens"] for t in rec["turns"]) for rec in recs] and min(masks) > 0

    open_episode(page, page.url_base, g, 0)
    img = page.locator(".turn[data-turn='0'] .frames img").first
    assert img.evaluate("async i => { await i.decode(); return i.naturalWidth > 0 }")  # decoded, not only in the DOM
    assert page.locator(".episode .tok.m1").count() == masks[0]
    for det in page.locator("details.prompt").all():  # opening the prompts adds no trained token
        det.locator("summary").click()
    assert page.locator(".episode .tok.m1").count() == masks[0] and page.locator(".tok.img").count() > 0

    assert "of 3 episodes" in count_text(page)
    page.locator("input[data-filter='topadv']").check()
    assert "1–1 of 1 episodes (3 in all)" in count_text(page)
    page.locator("input[data-filter='topadv']").uncheck()
    seed = str(recs[1]["seed"])
    expected = sum(seed in f"{r['env_name']} {r['seed']} {r['turns'][0]['reply'][:160]}".lower() for r in recs)
    page.fill("#search", seed)
    assert f"of {expected} episodes (3 in all)" in count_text(page) and expected < 3
    page.fill("#search", "")

    # two training steps: fresh seeds, and the page says the pairs are different boards
    page.select_option("#compare", train[1])
    page.wait_for_selector(".note.pairing[data-pairing='position']")
    assert page.locator("td.pair.diff").count() == 3


@pytest.mark.timeout(3600)
def test_real_run_validation_points_pair_by_env_seed(real_run, page):
    _, vals = groups(real_run)
    seeds = [json.loads(x)["seed"] for x in (real_run / "rollouts" / "val_000000.jsonl").read_text().splitlines()]
    assert len(seeds) == 3
    page.goto("about:blank")
    page.goto(page.url_base)
    page.wait_for_selector("body[data-ready='1']")
    assert page.locator("tr.group[data-group^='val_']").count() == 3
    assert page.locator("th", has_text="mismatch KL").count() == 1  # the RL steps panel
    page.locator("tr.group[data-group='val_000002']").click()
    page.wait_for_function("document.querySelector('#count').innerText.includes('of 3 episodes')")
    page.locator("tr.ep[data-i='0']").click()
    page.wait_for_selector(".episode .turn .frames img")
    img = page.locator(".turn .frames img").first
    assert img.evaluate("async i => { await i.decode(); return i.naturalWidth > 0 }")
    assert "not trained" in page.locator(".episode").inner_text()

    page.select_option("#compare", "val_000000")
    page.wait_for_selector(".note.pairing[data-pairing='seed']")
    assert page.locator("td.pair.same").count() == 3
    page.locator("tr.ep[data-i='2']").click()
    page.wait_for_selector(".compare .episode >> nth=1")
    assert f"same env seed {seeds[2]}" in page.locator(".pair-how[data-same-seed='1']").inner_text()
    heads = page.locator(".compare .episode h2").all_inner_texts()
    assert len(heads) == 2 and all(f"seed {seeds[2]} " in h for h in heads)
