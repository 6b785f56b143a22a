"""Error messages name the bad quantity and the knobs to turn."""

from __future__ import annotations

import pytest
import torch

from vagent.runconfig import RunConfig
from vagent.runs.errors import NonFiniteError, check_finite, first_non_finite, is_oom, oom_message


def test_first_non_finite_names_the_quantity():
    assert first_non_finite({"a": 1.0, "b": torch.tensor([1.0, 2.0])}) is None
    assert first_non_finite({"a": 1.0, "loss/value": torch.tensor([1.0, float("inf")])}) == ("loss/value", float("inf"))
    with pytest.raises(NonFiniteError, match=r"loss/policy became nan at rl step 7.*runs/x/checkpoints/step_000005"):
        check_finite({"loss/policy": float("nan")}, "rl", 7, "runs/x/checkpoints/step_000005")


def test_oom_detection_and_message():
    assert is_oom(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert is_oom(torch.OutOfMemoryError("x"))
    assert not is_oom(RuntimeError("shape mismatch"))
    msg = oom_message("rl", RunConfig())
    for knob in ("update.micro_batch_tokens", "rollout.group_size", "rollout.max_new_tokens",
                 "model.gradient_checkpointing", "model.lora_rank"):
        assert knob in msg
