"""The viewer in a real headless browser (Debian's chromium driven by Playwright).

On a two-step tiny run (tests/viewer/_run.py, written with the run's own writers and judged by
the real rule judge): an episode's turn shows its image; the number of highlighted (trained)
tokens on the page equals the batch's loss-mask count for that episode's row; the hover card
shows the token's numbers; the turn's reward table shows the judge's own reason; filters and
paging change the episode list; two training steps side by side say they share no seed; two
validation points pair by env seed; the ``--out`` page works from a file with no network
request; an evaluation directory opens without training columns. Saves a screenshot
(``VAGENT_WRITE_SCREENSHOT=1`` also writes docs/img/viewer.png for the README).
tests/viewer/test_real_run.py does the same on a real ``vagent train`` run.

Needs ``pip install playwright`` (its bundled browser is not used) and chromium
(``apt-get install -y chromium``); skipped with the reason otherwise.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.viewer._browser import CHROMIUM, sync_playwright
from tests.viewer._run import make_run

README_SHOT = Path(__file__).resolve().parents[2] / "docs" / "img" / "viewer.png"

pytestmark = [
    pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium)"),
    pytest.mark.skipif(sync_playwright is None, reason="playwright is not installed (pip install playwright)"),
]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("viewer") / "run"
    return root, make_run(root, steps=2, n_episodes=6, extra_clones=120)


def loss_count(out: dict, step: int, episode: int) -> int:
    batch = out[step][1]  # (episodes, batch, arrays, validation episodes)
    return int(batch.loss_mask[batch.episode_index == episode].sum())


def open_episode(page, url: str, group: str, i: int) -> None:
    page.goto(f"{url}#group={group}&i={i}")
    page.wait_for_selector("body[data-ready='1']")
    page.wait_for_selector(f".episode[data-episode='{group}#{i}']")


def count_text(page) -> str:
    return page.locator("#count").inner_text()


def test_episode_turns_tokens_filters_and_compare(run, served, page, tmp_path):
    root, out = run
    open_episode(page, served, "step_000000", 2)
    # the turn's image is there and decoded
    img = page.locator(".turn[data-turn='0'] .frames img").first
    assert img.evaluate("async i => { await i.decode(); return i.naturalWidth > 0 }")
    # highlighted tokens = the row's loss-mask count, and opening the prompts adds none
    assert page.locator(".episode .tok.m1").count() == loss_count(out, 0, 2) > 0
    # hover card: the token's id and numbers
    tok = page.locator(".episode .tok.m1").nth(3)
    tok.hover()
    card = page.locator("#tip")
    assert card.is_visible()
    row = out[0][1].episode_index.tolist().index(2)
    assert f"id {out[0][1].input_ids[row, int(tok.get_attribute('data-p'))]}" in card.inner_text()
    assert "advantage" in card.inner_text() and "value" in card.inner_text()
    # reward parts and the judge's own reason, as ReasoningReward recorded it
    ep = out[0][0][2]
    assert any(t.judge_reasons for t in ep.turns)
    for t in ep.turns:
        text = page.locator(f".turn[data-turn='{t.index}'] .rewards").inner_text()
        for kind, why in t.judge_reasons.items():
            assert why in text and f"judge: {kind}" in text
    assert any("anti-hacking penalty" in x for x in page.locator(".episode .rewards").all_inner_texts())
    page.screenshot(path=str(tmp_path / "viewer.png"))
    if os.environ.get("VAGENT_WRITE_SCREENSHOT") == "1":
        README_SHOT.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(README_SHOT))
    for det in page.locator("details.prompt").all():
        det.locator("summary").click()
    assert page.locator(".episode .tok.m1").count() == loss_count(out, 0, 2)
    assert page.locator(".episode .tok.m0").count() > 0 and page.locator(".tok.img").count() > 0

    # step 1: 6 episodes + 120 summary-only clones -> paged, filters change the list
    page.locator("tr.group[data-group='step_000001']").click()
    page.wait_for_function("document.querySelector('#count').innerText.includes('of 126')")
    assert page.locator("tr.ep").count() == 50
    eps = out[1][0]
    n_failed = sum(not e.success for e in eps) + 120 * (not eps[0].success)
    page.locator("input[data-filter='failed']").check()
    assert f"of {n_failed} episodes" in count_text(page)
    page.locator("input[data-filter='failed']").uncheck()
    page.locator("input[data-filter='judge']").check()
    judged = [any(r < 0 or (t.reasoning_scores.get(k) and r == 0) for t in e.turns
                  for k, r in t.reasoning_rewards.items()) for e in eps]
    n_judge = sum(judged) + 120 * judged[0]
    assert f"of {n_judge} episodes" in count_text(page) and n_judge != 126
    page.locator("input[data-filter='judge']").uncheck()
    page.locator("input[data-filter='topadv']").check()
    assert "of 1 episodes" in count_text(page)  # top 10% of the 6 episodes with token rows
    page.locator("input[data-filter='topadv']").uncheck()
    page.locator("button", has_text="next").click()
    assert "51–100 of 126" in count_text(page)

    # side by side: step 1 vs step 0 (no shared seed -> paired by position, and it says so)
    page.select_option("#compare", "step_000000")
    page.wait_for_selector(".note.pairing[data-pairing='position']")
    assert "0 pair(s) share the env seed" in page.locator(".note.pairing").inner_text()
    assert page.locator("td.pair.diff").count() == 6 and page.locator("td.pair.same").count() == 0
    page.locator("tr.ep[data-i='1']").click()
    page.wait_for_selector(".compare .episode >> nth=1")
    assert page.locator(".compare .episode").count() == 2
    assert "different boards: seed 101 vs 1" in page.locator(".pair-how[data-same-seed='0']").inner_text()
    assert page.locator(".compare .tok.m1").count() == loss_count(out, 1, 1) + loss_count(out, 0, 1)


def test_validation_points_are_listed_and_pair_by_env_seed(run, served, page):
    root, out = run
    page.goto(served)
    page.wait_for_selector("body[data-ready='1']")
    assert page.locator("tr.group[data-group^='val_']").count() == 2
    page.locator("tr.group[data-group='val_000001']").click()
    page.wait_for_function("document.querySelector('#count').innerText.includes('of 3 episodes')")
    page.select_option("#compare", "val_000000")
    page.wait_for_selector(".note.pairing[data-pairing='seed']")
    assert page.locator("td.pair.same").count() == 3 and page.locator("td.pair.diff").count() == 0
    page.locator("tr.ep[data-i='1']").click()
    page.wait_for_selector(".compare .episode >> nth=1")
    assert "same env seed 8" in page.locator(".pair-how[data-same-seed='1']").inner_text()
    heads = page.locator(".compare .episode h2").all_inner_texts()
    assert len(heads) == 2 and all("seed 8 " in h for h in heads)
    # the same board, replied to differently at the two points (the scripted replies follow the step)
    first = [t.reply for t in out[1][3][1].turns][0], [t.reply for t in out[0][3][1].turns][0]
    assert first[0] != first[1]
    texts = page.locator(".compare .turn[data-turn='0'] .reply-block").all_inner_texts()
    assert first[0] in texts[0] and first[1] in texts[1]
    assert "validation episodes are played greedily and not trained" in page.locator(".compare").inner_text()

    # a training step vs a validation point: seed 3 is in both, the rest are paired by position
    page.locator("tr.group[data-group='step_000000']").click()
    page.wait_for_function("document.querySelector('#count').innerText.includes('(6 in all)') || "
                           "document.querySelector('#count').innerText.includes('of 6 episodes')")
    page.select_option("#compare", "val_000000")
    page.wait_for_selector(".note.pairing[data-pairing='mixed']")
    assert "1 pair(s) share the env seed" in page.locator(".note.pairing").inner_text()
    assert page.locator("td.pair.same").count() == 1 and page.locator("td.pair.diff").count() == 2
    assert page.locator("tr.ep[data-i='3'] td.pair.same").count() == 1  # step 0's episode 3 has seed 3


def test_out_file_is_self_contained(run, page, tmp_path):
    from vagent.viewer.data import open_source
    from vagent.viewer.server import static_html

    root, out = run
    html = tmp_path / "view.html"
    html.write_text(static_html(open_source(root), max_episodes=10))
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    open_episode(page, html.as_uri(), "step_000001", 0)
    assert page.locator(".turn .frames img").first.evaluate("async i => { await i.decode(); return i.naturalWidth > 0 }")
    assert page.locator(".episode .tok.m1").count() == loss_count(out, 1, 0)
    assert all(u.startswith(("file:", "data:")) for u in requests), requests


def test_eval_directory_without_training_columns(page, tmp_path, monkeypatch):
    from tests.eval.servers import Answer, ScriptedChatServer
    from vagent.eval.config import load_config
    from vagent.eval.runner import run_eval
    from vagent.viewer.data import open_source
    from vagent.viewer.server import serve_in_thread

    monkeypatch.setenv("EVAL_TEST_KEY", "k")
    with ScriptedChatServer(lambda req: Answer("<answer>Right</answer>")) as srv:
        run_eval(load_config({
            "envs": [{"name": "frozenlake", "config": {"render": "vision", "image_size": 48}}],
            "formats": ["no_think"], "seeds": ["val:0-1"], "max_turns": 2, "out_dir": str(tmp_path / "ev"),
            "models": [{"backend": "openai", "model": "m", "base_url": srv.url + "/v1", "api_key_env": "EVAL_TEST_KEY",
                        "concurrency": 1}], "print_table": False,
        }))
    server, url = serve_in_thread(open_source(tmp_path / "ev"), port=0)
    try:
        page.goto(url)
        page.wait_for_selector("body[data-ready='1']")
        assert page.locator("tr.ep").count() == 2
        assert "max|A|" not in page.locator("#episodes").inner_text()
        assert page.locator("input[data-filter='topadv']").count() == 0
        page.locator("tr.ep").first.click()
        page.wait_for_selector(".episode")
        assert page.locator(".turn .frames img").first.evaluate("async i => { await i.decode(); return i.naturalWidth > 0 }")
        assert "evaluation records hold no tokens" in page.locator(".episode").inner_text()
    finally:
        server.shutdown()
        server.server_close()
