"""``vagent eval`` exits 1 when episodes failed, and says so in one line: how many of the expected
episodes, whether a cell measured nothing, and the first error's own line (docs/evaluation.md,
"Exit codes"). An errored episode is not a result: it is counted in ``errors``, left out of the
success rates, and run again by the same command.

- every episode fails: primitive_skill on ``backend=maniskill`` without ManiSkill (.venv), a real
  ``vagent`` process, as the issue's 128-seed paper eval that "finished" with exit 0;
- one cell of two measures nothing (its env cannot be made), the other is fine;
- one episode of two fails (the API refuses its request) in an otherwise measured cell.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.eval.servers import Answer, Fail, ScriptedChatServer

MANISKILL = {"name": "primitive_skill", "config": {"backend": "maniskill", "render": "text"}}
no_maniskill = pytest.mark.skipif(importlib.util.find_spec("mani_skill") is not None,
                                  reason="ManiSkill is installed here: its episodes would run")


def _eval(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """The ``vagent eval`` command of this environment (its console script), as a user runs it, with
    an API key set (the scripted server takes any)."""
    script = Path(sys.executable).with_name("vagent")
    cmd = [str(script)] if script.is_file() else [sys.executable, "-m", "vagent.cli"]
    return subprocess.run([*cmd, "eval", *args], cwd=cwd, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "EVAL_TEST_KEY": "k", "OPENAI_API_KEY": "k"})


def _config(tmp_path: Path, url: str, envs: list[dict], **over) -> Path:
    path = tmp_path / "eval.yaml"
    path.write_text(yaml.safe_dump({
        "envs": envs, "formats": ["no_think"], "seeds": ["val:0-1"], "max_turns": 1, "out_dir": str(tmp_path / "ev"),
        "models": [{"backend": "openai", "model": "m", "base_url": url + "/v1", "api_key_env": "EVAL_TEST_KEY",
                    "concurrency": 1, "max_retries": 0}], "print_table": False, **over}))
    return path


@no_maniskill
def test_every_episode_failed_exits_1_with_one_line(tmp_path):
    done = _eval("--backend", "openai", "--model", "m", "--base-url", "http://127.0.0.1:9/v1", "--env",
                 "primitive_skill", "--env-config", "backend=maniskill", "--seeds", "test:2", "--out",
                 str(tmp_path / "ev"), "--no-html", cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("vagent eval: 2 of 2 episodes failed (nothing was measured; the same command runs them "
                           "again); first error: env: ImportError: backend='maniskill' needs ManiSkill 3"), last
    assert "pip install 'vagent[maniskill]'" in last and "No module named 'sapien'" in last, last
    summary = json.loads((tmp_path / "ev" / "summary.json").read_text())  # the summary is still written
    assert [(c["errors"], c["valid"]) for c in summary["cells"]] == [(2, 0)]
    assert summary["cells"][0]["error_examples"][0].startswith("env: ImportError: backend='maniskill'")


@no_maniskill
def test_a_cell_that_measured_nothing_is_named(tmp_path):
    with ScriptedChatServer(lambda req: Answer("<answer>Right</answer>")) as srv:
        config = _config(tmp_path, srv.url, [{"name": "frozenlake", "config": {"render": "text"}}, MANISKILL])
        done = _eval("--config", str(config), cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("vagent eval: 2 of 4 episodes failed (1 of 2 cells measured nothing: "
                           "primitive_skill/m/no_think; the same command runs them again); first error: env: "
                           "ImportError: backend='maniskill'"), last


def test_some_failed_episodes_exit_1_and_a_rerun_that_measures_them_exits_0(tmp_path):
    answers = iter([Fail(400, message="content policy")])  # the first request only
    with ScriptedChatServer(lambda req: next(answers, Answer("<answer>Right</answer>"))) as srv:
        config = _config(tmp_path, srv.url, [{"name": "frozenlake", "config": {"render": "text"}}])
        done = _eval("--config", str(config), cwd=tmp_path)
        assert done.returncode == 1, done.stdout + done.stderr
        last = done.stderr.strip().splitlines()[-1]
        assert last.startswith("vagent eval: 1 of 2 episodes failed (left out of the success rates; the same "
                               "command runs them again); first error: policy: "), last
        assert "content policy" in last, last
        again = _eval("--config", str(config), cwd=tmp_path)  # retry_errors: the failed episode only
    assert again.returncode == 0, again.stdout + again.stderr
    assert "vagent eval:" not in again.stderr and "1 finished on disk, 1 to run" in again.stderr


def test_the_line_of_an_error_is_its_exception_not_the_traceback_header():
    from vagent.eval.report import error_headline

    tb = ("env: Traceback (most recent call last):\n  File \"x.py\", line 1, in f\n    g()\n"
          "ImportError: backend='maniskill' needs ManiSkill 3\n")
    assert error_headline(tb) == "env: ImportError: backend='maniskill' needs ManiSkill 3"
    assert error_headline("policy: request failed: openai: 400\nmore") == "policy: request failed: openai: 400"
    assert error_headline("") == ""
