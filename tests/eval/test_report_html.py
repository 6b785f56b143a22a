"""report.html is self-contained and renders in headless Chromium: every inline image decodes,
every episode and turn is there. The CI installs Chromium with ``apt-get install -y chromium``."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

from tests.eval.servers import Answer, ScriptedChatServer
from vagent.eval.config import load_config
from vagent.eval.runner import run_eval

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def _dump_dom(html_path, tmp_path) -> str:
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-extensions",
           f"--user-data-dir={tmp_path / 'chromium-profile'}", "--virtual-time-budget=3000", "--dump-dom",
           html_path.as_uri()]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)  # a busy 2-core machine
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium)")
def test_html_report_renders_in_headless_chromium(tmp_path, monkeypatch):
    monkeypatch.setenv("EVAL_TEST_KEY", "k")
    replies = iter(["<answer>Right</answer>", "<answer>Down & <b>bold</b></answer>"] * 10)
    with ScriptedChatServer(lambda req: Answer(next(replies))) as srv:
        cfg = load_config({
            "envs": [{"name": "frozenlake", "config": {"render": "vision", "image_size": 64}}],
            "formats": ["no_think"], "seeds": ["val:0-1"], "max_turns": 2, "out_dir": str(tmp_path / "run"),
            "models": [{"backend": "openai", "model": "m", "base_url": srv.url + "/v1", "api_key_env": "EVAL_TEST_KEY",
                        "concurrency": 1}],
            "print_table": False,
        })
        run_eval(cfg)
    page = tmp_path / "run" / "report.html"
    text = page.read_text()
    assert "http://" not in text.replace(srv.url, "") and "src=\"data:image/png;base64," in text  # self-contained
    recs = [json.loads(p.read_text()) for p in (tmp_path / "run" / "episodes").rglob("*.json")]
    n_images = sum(len(t["observation"]["images"]) for r in recs for t in r["turns"]) + sum(
        len(r["final_observation"]["images"]) for r in recs if r["final_observation"])
    assert n_images >= 4

    dom = _dump_dom(page, tmp_path)
    body = re.search(r"<body([^>]*)>", dom).group(1)
    assert f'data-images-loaded="{n_images}"' in body and 'data-images-broken="0"' in body, body
    assert dom.count('<details class="episode"') == 2
    assert dom.count('<div class="turn">') == sum(len(r["turns"]) for r in recs)
    assert "Down &amp; &lt;b&gt;bold&lt;/b&gt;" in dom and "<b>bold</b>" not in dom  # replies are escaped
    assert "success (95% CI)" in dom
