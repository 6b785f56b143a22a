"""What a run says about itself (issue 56): a ``--smoke`` run says smoke mode is on and lists the
values --smoke set apart from the recipe file's; a run without validation says it is off."""

from __future__ import annotations

import argparse
from pathlib import Path

from vagent.runconfig import load_config
from vagent.recipes.scale import applied_smoke, load_scaled
from vagent.runs.progress import ConfigSource, config_summary, startup_arithmetic

RECIPE = str(Path(__file__).resolve().parents[2] / "configs" / "paper" / "sokoban_vagen_full.yaml")


def _summary(overrides: tuple[str, ...]) -> list[str]:
    source = ConfigSource(RECIPE, overrides, applied_smoke(RECIPE, True))
    cfg = load_scaled(RECIPE, list(overrides), smoke=True)
    return config_summary(cfg, load_config(), "c.yaml", width=2000, source=source)  # one line a section


def test_a_smoke_run_says_smoke_mode_and_attributes_its_values_to_it():
    lines = _summary(("val.every=1",))
    assert lines[0].endswith(", smoke mode: --smoke)"), lines
    (smoke_at,) = [i for i, ln in enumerate(lines) if ln.startswith("  smoke mode: ")]
    (file_at,) = [i for i, ln in enumerate(lines) if " set by " + RECIPE in ln]
    smoke, file = " ".join(lines[smoke_at:file_at]), " ".join(lines[file_at:])
    assert "set by --smoke (configs/paper/smoke.yaml):" in smoke
    for item in ("model.path=tiny", "steps=1", "rollout.max_turns=2", "log.progress=false"):
        assert item in smoke and item not in file, (item, lines)
    # the command line's override wins over --smoke: it is the file's and the overrides' value
    assert "val.every=1" in file and "val.every" not in smoke, lines
    assert "ppo.estimator=bi_level_gae" in file  # what the recipe itself sets stays the recipe's


def test_without_smoke_the_summary_is_the_files():
    cfg = load_config(RECIPE, [])
    lines = config_summary(cfg, load_config(), "c.yaml", source=ConfigSource(RECIPE, ()))
    assert "smoke" not in " ".join(lines) and lines[1].startswith(f"  ") and f"set by {RECIPE}:" in lines[1]


def test_vagent_train_smoke_hands_the_smoke_overrides_to_the_summary(monkeypatch):
    """``vagent train --config RECIPE --smoke``: the command's ConfigSource carries --smoke's
    overrides (the run itself is replaced by a stub)."""
    import vagent.recipes.run as run
    from vagent.recipes.cli import run_train

    handed = {}
    monkeypatch.setattr(run, "train", lambda cfg, quiet, source: handed.update(cfg=cfg, source=source))
    args = argparse.Namespace(describe=False, resume=None, config=[RECIPE], overrides=["threads=1"], smoke=True,
                              quiet=True, imports=[], nproc=None, nnodes=1)
    assert run_train(args) == 0
    assert handed["source"].smoke == applied_smoke(RECIPE, True) and handed["cfg"].model.path == "tiny"


def test_validation_off_is_said_as_off(tmp_path):
    off = startup_arithmetic(load_config(None, ["val.every=0"]), tmp_path)
    assert "validation: off (val.every=0)" in off and not any("every 0 steps" in ln for ln in off), off
    on = startup_arithmetic(load_config(None, []), tmp_path)
    assert "validation: every 10 steps on 128 frozenlake val-split episodes (greedy)" in on


def test_the_micro_batch_budget_line_says_a_longer_row_goes_alone(tmp_path):
    """``update.micro_batch_tokens`` below one row's length is legal (tests use it for one row per
    micro-batch): the start-up line must not claim every micro-batch fits the budget."""
    cfg = load_config(overrides=["update.micro_batch_tokens=16"])
    (line,) = [x for x in startup_arithmetic(cfg, tmp_path) if "micro-batches of" in x]
    assert "<= 16 tokens (a longer row alone)" in line
