"""What the viewer page says about a run, in a real headless browser (chromium + Playwright).

On the two-step tiny run of tests/viewer/_run.py, whose step 0 is marked as a critic warm-up
step (``actor/updated`` 0 in metrics.jsonl, as PPO logs it during ``ppo.critic_warmup_steps``),
plus a validation point of text-rendered FrozenLake episodes:

- the page opens on the first episode of the first step, with no fragment; ``#group=G&i=N``
  opens that one;
- a warm-up step's sampled tokens are marked as not trained (outlined, no advantage colour, a
  note saying the actor was not updated), in the step table too; a step that updated the actor
  keeps its colours;
- a text env's observation (the board) is shown in full, not only in the collapsed prompt;
- each episode has a legend of its env's board symbols, with the tile each one is drawn as;
- an ``--out`` page whose replies hold ``<!--<script>`` and ``</script>`` works and shows them;
- a file the server cannot read is shown as its one-line error, naming the file and line.
"""

from __future__ import annotations

import json

import pytest
import torch

from tests.viewer._browser import CHROMIUM, sync_playwright
from tests.viewer._run import ENV_CONFIG, episode, make_run
from tests.viewer.test_browser import loss_count, open_episode

pytestmark = [
    pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium)"),
    pytest.mark.skipif(sync_playwright is None, reason="playwright is not installed (pip install playwright)"),
]

TEXT = {**ENV_CONFIG, "render": "text"}
HOSTILE = 'I will go <!--<script> right </script><script>throw new Error("ran")</script> & down'


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from vagent.runs.samples import save_validation

    root = tmp_path_factory.mktemp("page_reads") / "run"
    out = make_run(root, steps=2, n_episodes=3)
    with (root / "metrics.jsonl").open("a") as f:  # step 0 trained the critic only
        f.write(json.dumps({"step": 0, "phase": "rl", "actor/updated": 0.0}) + "\n")
        f.write(json.dumps({"step": 1, "phase": "rl", "actor/updated": 1.0}) + "\n")
    gen = torch.Generator().manual_seed(9)
    text_eps = [episode(seed, v, 9, gen, env_config=TEXT) for v, seed in enumerate((3, 8))]
    save_validation(root / "rollouts", 9, text_eps, 50.0)
    return root, out, text_eps


def test_opens_on_the_first_episode(served, page):
    page.goto(served)
    page.wait_for_selector(".episode[data-episode='step_000000#0']")
    assert page.locator("tr.ep.current").get_attribute("data-i") == "0"
    assert "Pick an episode" not in page.locator("#episode-pane").inner_text()
    page.locator("tr.group[data-group='step_000001']").click()  # a step picked from the table opens its first too
    page.wait_for_selector(".episode[data-episode='step_000001#0']")


def test_a_warmup_step_marks_its_tokens_as_not_trained(run, served, page):
    root, out, _ = run
    open_episode(page, served, "step_000000", 1)
    assert page.locator("tr.group[data-group='step_000000']").get_attribute("data-actor-updated") == "0"
    assert "critic warm-up" in page.locator("tr.group[data-group='step_000000']").inner_text()
    note = page.locator(".episode .note.warmup").inner_text()
    assert "Actor not updated at this step" in note and f"{loss_count(out, 0, 1)} sampled tokens" in note
    frozen = page.locator(".episode .tok.m1.frozen")
    assert frozen.count() == page.locator(".episode .tok.m1").count() == loss_count(out, 0, 1) > 0
    assert "trained tokens" not in page.locator(".episode").inner_text()
    backgrounds = set(frozen.evaluate_all("els => els.map(e => e.style.background)"))
    assert backgrounds == {""}, backgrounds  # no advantage colour on tokens the policy was not trained on
    # a step that updated the actor: coloured, "trained tokens"
    page.goto("about:blank")  # a new fragment alone does not reload the page
    open_episode(page, served, "step_000001", 1)
    assert page.locator(".episode .tok.m1.frozen").count() == 0 and page.locator(".episode .note.warmup").count() == 0
    assert f"{loss_count(out, 1, 1)} trained tokens" in page.locator(".episode .legend").inner_text()
    assert page.locator("tr.group[data-group='step_000001']").get_attribute("data-actor-updated") is None


def test_a_text_envs_observation_is_shown(run, served, page):
    _, _, text_eps = run
    open_episode(page, served, "val_000009", 1)
    ep = text_eps[1]
    for t in ep.turns:
        shown = page.locator(f".turn[data-turn='{t.index}'] .observation pre")
        assert shown.is_visible() and shown.inner_text() == t.observation.text
    board = ep.turns[0].observation.text
    assert "G" in board and "P" in board  # the grid itself is in what the page shows


def test_each_episode_has_a_legend_of_its_boards_symbols(served, page):
    open_episode(page, served, "step_000000", 0)
    legend = page.locator(".episode .env-legend")
    assert "frozenlake board" in legend.inner_text()
    for symbol, meaning in (("P", "player"), ("O", "hole"), ("G", "goal"), ("_", "ice")):
        item = legend.locator(f".sym[data-symbol='{symbol}']")
        assert meaning in item.inner_text()
        assert item.locator("img").evaluate("async i => { await i.decode(); return i.naturalWidth > 0 }")


def test_out_page_embeds_any_text(run, page, tmp_path):
    from vagent.viewer.data import open_source
    from vagent.viewer.server import static_html

    root = run[0]
    path = root / "rollouts" / "step_000001.jsonl"
    original = path.read_text()
    recs = [json.loads(line) for line in original.splitlines()]
    recs[0]["turns"][0]["reply"] = HOSTILE
    recs[0]["env_name"] = "frozenlake"
    try:
        path.write_text("".join(json.dumps(r) + "\n" for r in recs))
        html = tmp_path / "view.html"
        html.write_text(static_html(open_source(root), max_episodes=2))
    finally:
        path.write_text(original)
    page.goto(html.as_uri() + "#group=step_000001&i=0")
    page.wait_for_selector("body[data-ready='1']")
    page.wait_for_selector(".episode[data-episode='step_000001#0']")
    assert page.locator(".turn[data-turn='0'] .reply-block").count() == 1
    # the reply is on the page as text (the token row of the scripted run differs from the new text,
    # so the turn shows the record's reply where the list's search reads it)
    page.fill("#search", "<!--<script>")
    assert "of 1 episodes" in page.locator("#count").inner_text()


def test_a_file_the_server_cannot_read_is_shown_by_name_and_line(page, tmp_path):
    from tests.viewer.test_safety import NO_TURNS, RECORD, write_run
    from vagent.viewer.data import open_source
    from vagent.viewer.server import serve_in_thread

    root = write_run(tmp_path / "run", records=[RECORD, NO_TURNS])
    server, url = serve_in_thread(open_source(root), port=0)
    try:
        page.goto(url)
        page.wait_for_selector("body[data-ready='error']")
        text = page.locator("#episode-pane .note.error").inner_text()
        assert text.startswith("rollouts/step_000001.jsonl line 2: no 'turns'"), text
    finally:
        server.shutdown()
        server.server_close()
