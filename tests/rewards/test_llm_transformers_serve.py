"""The LLM judge against `transformers serve` running SmolLM2-135M-Instruct on loopback (slow).

A real OpenAI-compatible server in a subprocess with a real (tiny, weak) language model: this
proves the judge's HTTP plumbing and prompts work with a real server, not that SmolLM2 judges
well (it does not: it is a 135M model). Each answer is either parsed (a verdict) or counted as a
parse error and sent to the fallback; transport errors must be zero.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.service.conftest import stop_process
from vagent.envs.frozenlake import LEGEND, FrozenLakeEnv, state_from_grid
from vagent.rewards import JudgeItem, LLMJudge, LLMJudgeConfig

pytestmark = pytest.mark.slow

STATE = state_from_grid(["O__G", "_P__", "___O", "____"])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served_model(smollm2_dir, tmp_path_factory):
    exe = Path(sys.executable).with_name("transformers")
    if not exe.exists() and shutil.which("transformers") is None:
        pytest.skip("the `transformers` CLI is not installed (pip install 'transformers[serving]')")
    port = free_port()
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    with open(log, "w") as fh:
        proc = subprocess.Popen([str(exe if exe.exists() else "transformers"), "serve", str(smollm2_dir),
                                 "--host", "127.0.0.1", "--port", str(port), "--device", "cpu"],
                                stdout=fh, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 40
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"transformers serve did not come up (exit {proc.poll()}):\n{log.read_text()[-3000:]}")
            time.sleep(0.3)
        yield f"http://127.0.0.1:{port}/v1", str(smollm2_dir)
    finally:
        stop_process(proc, 10)


@pytest.mark.timeout(300)  # ~30 s on an idle 2-core machine; generous for a loaded one
def test_llm_judge_against_transformers_serve(served_model):
    base_url, model = served_model
    item = JudgeItem("The goal is above and to the right of you.", STATE, FrozenLakeEnv.judge_spec,
                     "grounding", LEGEND, None, "frozenlake")
    for mode, max_tokens in (("yesno", 3), ("parse", 40)):
        judge = LLMJudge(LLMJudgeConfig(base_url=base_url, model=model, mode=mode, max_tokens=max_tokens,
                                        temperature=0.0, timeout_s=120, max_retries=0, deadline_s=150,
                                        fallback="zero"))
        t0 = time.monotonic()
        [r] = judge.score([item])
        stats = judge.last_stats
        print(f"{mode}: {time.monotonic() - t0:.1f} s, score {r.score}, fallback {r.fallback}, "
              f"{r.detail.get('answer', r.detail.get('fallback_reason'))!r}")
        assert stats["requests"] == 1
        assert stats["timeouts"] == stats["connection_errors"] == stats["server_errors"] == stats["client_errors"] == 0
        # the request was answered over HTTP: a verdict, or garbage counted and sent to the fallback
        assert stats["parse_errors"] == stats["fallbacks"] == float(r.fallback)
        assert 0.0 <= r.score <= 1.0
        assert (r.detail["judge"] == "llm") != r.fallback
        if r.fallback:
            assert r.detail["fallback_reason"].startswith("garbage")
