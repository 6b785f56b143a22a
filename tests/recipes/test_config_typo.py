"""A --config file that does not exist: the error names the closest preset or paper recipe and lists
the paper's recipes (configs/paper/) beside the presets (issue 56: only the presets were listed)."""

from __future__ import annotations

import argparse
import re

import pytest

from vagent.config import ConfigError
from vagent.runconfig import load_config, preset_dir, training_presets


def test_the_error_lists_the_paper_recipes_and_suggests_the_closest():
    with pytest.raises(ConfigError) as info:
        load_config("configs/paper/sokoban_vagen_ful.yaml")
    msg = str(info.value)
    assert "Did you mean configs/paper/sokoban_vagen_full.yaml?" in msg, msg
    (names,) = re.findall(r"configs/paper/<name>\.yaml, <name> one of ([^(]+) \(presets: ", msg)
    listed = names.split(", ")
    assert len(listed) == 20 and "smoke" not in listed and not any(n.startswith("eval_") for n in listed)
    assert listed == training_presets("paper")
    for name in listed[:2]:  # each is a run config (all 20 load in test_paper_recipes.py)
        load_config(preset_dir() / "paper" / f"{name}.yaml")


def test_vagent_train_with_a_typo_says_it_in_one_line(capsys):
    from vagent.recipes.cli import run_train

    args = argparse.Namespace(describe=False, resume=None, config=["configs/paper/svg_turnppo.yaml"], overrides=[],
                              smoke=False, quiet=True, imports=[], nproc=None, nnodes=1)
    assert run_train(args) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Did you mean configs/paper/svg_turn_ppo.yaml?" in err[0] and "sokoban_vagen_full" in err[0]
