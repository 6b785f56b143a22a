"""``vagent train --config A --config B``: the files are layered in order (issue 44, item 2)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from vagent.config import ConfigError
from vagent.recipes.cli import layered_config, merge_trees
from vagent.runconfig import load_config


def _write(path, tree) -> str:
    path.write_text(yaml.safe_dump(tree))
    return str(path)


def test_later_files_override_earlier_ones_mappings_merge_lists_replace(tmp_path):
    base = _write(tmp_path / "base.yaml", {
        "steps": 7, "seed": 3, "update": {"actor_lr": 2e-5, "epochs": 2},
        "envs": [{"name": "frozenlake", "n_train": 4, "n_val": 4}]})
    mine = _write(tmp_path / "mine.yaml", {"seed": 5, "update": {"epochs": 3},
                                            "envs": [{"name": "sokoban", "n_train": 2, "n_val": 2}]})
    cfg = load_config(layered_config([base, mine]), ["steps=9"])
    assert cfg.seed == 5  # the later file wins
    assert cfg.update.actor_lr == 2e-5 and cfg.update.epochs == 3  # a mapping is merged key by key
    assert [e.name for e in cfg.envs] == ["sokoban"] and cfg.envs[0].n_train == 2  # a list is replaced
    assert cfg.steps == 9  # the command line's overrides still win over every file
    assert merge_trees({"a": {"b": 1, "c": 2}}, {"a": {"c": 3}}) == {"a": {"b": 1, "c": 3}}
    assert layered_config([]) is None and layered_config([base]) == base  # none / one file: as before


def test_a_missing_or_non_mapping_layer_is_named(tmp_path):
    base = _write(tmp_path / "base.yaml", {"steps": 7})
    with pytest.raises(ConfigError, match="'nope.yaml' does not exist"):
        layered_config([base, "nope.yaml"])
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="list.yaml: expected a mapping"):
        layered_config([base, str(tmp_path / "list.yaml")])


def test_the_command_reads_the_first_file_too(tmp_path):
    """The first file's key takes effect through the real command: an out_dir that is a file is
    refused at load, before any model is built (before the fix the first file was dropped)."""
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    first = _write(tmp_path / "first.yaml", {"out_dir": str(blocker)})
    second = _write(tmp_path / "second.yaml", {"seed": 1})
    out = subprocess.run([sys.executable, "-m", "vagent", "train", "--config", first, "--config", second],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 1, out.stdout[-2000:] + out.stderr[-2000:]
    assert out.stderr.strip().splitlines() == [
        f"error: out_dir {str(blocker)!r} is a file, not a folder; set out_dir= a folder (it is created if "
        "missing), e.g. out_dir=runs."], out.stderr


@pytest.mark.parametrize("job", [[], ["--nproc", "2"]], ids=["one-process", "torchrun-job"])
def test_resume_with_a_config_file_is_refused_in_one_line(tmp_path, job):
    """``--resume`` keeps the run's saved config.yaml: a ``--config`` beside it is refused before
    anything loads, in one process and before torchrun starts a rank."""
    out = subprocess.run([sys.executable, "-m", "vagent", "train", *job, "--resume", str(tmp_path / "run"),
                          "--config", "configs/frozenlake_ppo.yaml"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == [
        "error: --resume continues a run with its saved config.yaml; drop --config."], out.stderr[-2000:]
