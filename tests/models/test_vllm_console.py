"""vLLM's console output (issue 44, item 6): its INFO lines behind ``VLLM_LOGGING_LEVEL`` (vagent's
default WARNING), the expected "Failed to load weights" of a weight push filtered with one line
saying why. The filter is checked on its logger without vLLM; the vllm-marked test pushes weights
into a real engine (run in .venv-vllm)."""

from __future__ import annotations

import logging
import os

import pytest

from vagent.models.vllm_setup import EXPECTED_RELOAD_WARNINGS, ExpectedReloadWarnings, quiet_vllm_logging

RELOAD = "vllm.model_executor.model_loader.reload.layerwise"


def test_expected_reload_warnings_are_dropped_with_one_line_others_pass(caplog, monkeypatch):
    monkeypatch.delenv("VLLM_LOGGING_LEVEL", raising=False)
    reload_logger = logging.getLogger(RELOAD)
    monkeypatch.setattr(reload_logger, "filters", [])
    quiet_vllm_logging()
    quiet_vllm_logging()  # once only
    assert os.environ["VLLM_LOGGING_LEVEL"] == "WARNING"
    assert sum(isinstance(f, ExpectedReloadWarnings) for f in reload_logger.filters) == 1
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            for layer in EXPECTED_RELOAD_WARNINGS:
                reload_logger.warning("%s: Failed to load weights", layer)
        reload_logger.warning("%s: Failed to load weights", "QKVParallelLinear")  # not an expected one
    texts = [r.getMessage() for r in caplog.records]
    assert "QKVParallelLinear: Failed to load weights" in texts
    assert not any(t.startswith(EXPECTED_RELOAD_WARNINGS) and t.endswith("Failed to load weights") for t in texts)
    said = [t for t in texts if "is expected" in t]
    assert len(said) == 1 and "FusedMMInputNorm / RotaryEmbedding / MRotaryEmbedding" in said[0]


def test_a_level_the_user_set_is_kept(monkeypatch):
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "INFO")
    quiet_vllm_logging()
    assert os.environ["VLLM_LOGGING_LEVEL"] == "INFO"


def docs_python_example() -> str:
    """The Python block of docs/models.md's vLLM section ("Running it"), as written."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "models.md").read_text()
    section = text[text.index("**Running it.**"):]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


def test_the_docs_example_is_found():
    code = docs_python_example()
    assert "VLLMEngine(" in code and "images=tuple(obs.images)" in code and "update_weights" in code


@pytest.mark.vllm
def test_the_docs_example_runs_and_a_push_prints_no_failed_to_load_line(tmp_path):
    """docs/models.md's example, as written, in a fresh process: it generates, pushes, and the
    console has neither vLLM's INFO lines nor its expected reload warnings (one line instead)."""
    import subprocess
    import sys

    (tmp_path / "example.py").write_text(docs_python_example())
    env = {k: v for k, v in os.environ.items() if k != "VLLM_LOGGING_LEVEL"}
    out = subprocess.run([sys.executable, "example.py"], capture_output=True, text=True, timeout=600, env=env,
                         cwd=tmp_path)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-4000:]
    assert "tokens, version 0" in out.stdout and "version after the push: 1" in out.stdout, out.stdout
    assert "refused before start-up: True | request 0: VLLMEngine needs the raw images" in out.stdout, out.stdout
    assert "Failed to load weights" not in text.replace("'Failed to load weights'", ""), text[-4000:]
    assert text.count("is expected (they hold no pushed tensor") <= 1
    assert " INFO " not in text, [line for line in text.splitlines() if " INFO " in line][:5]


def test_the_docs_train_command_is_found():
    from tests.vllm_tiny import docs_train_command

    assert docs_train_command() == [".venv-vllm/bin/vagent", "train", "rollout.engine=vllm"]
