"""docs/metrics.md and docs/training.md state what the code does (issue 56: progress lines "at most 20
per phase plus one every 30 s" against the code's 10 and 5 minutes; the default run's micro-batches
"at most 1024 tokens" against its packed 4,096)."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from vagent.runconfig import load_config
from vagent.runs.progress import StepProgress

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _text(name: str) -> str:
    return re.sub(r"\s+", " ", (DOCS / name).read_text())


def test_metrics_md_gives_the_progress_lines_stepprogress_prints():
    interval_s = inspect.signature(StepProgress).parameters["interval_s"].default
    assert interval_s % 60 == 0
    said = (f"about {StepProgress.LINES} per phase (every `steps/{StepProgress.LINES}` steps and the last step) "
            f"plus one after {interval_s // 60:.0f} minutes without a line")
    assert said in _text("metrics.md")


def test_training_md_gives_the_default_runs_micro_batches():
    update = load_config().update
    packed = "packed micro-batches" if update.packing else "micro-batches"
    section = _text("training.md").split("## The default run", 1)[1].split("### Why the tiny model", 1)[0]
    assert f"{packed} of at most {update.micro_batch_tokens:,} tokens" in section, section
