"""A resume that cannot lie (issue 47) on real runs of the tiny VLM: a damaged KL reference
(``sft_000002``) makes the RL checkpoints fall back with it, SFT step 2 runs again and the run
equals the uninterrupted one; an edited, emptied or changed-shape ``config.yaml`` is refused
before any model work, listing each changed field; ``steps`` changes only when named, and the
change is recorded in ``run.json`` once the resume is accepted."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from vagent.cli import main
from vagent.config import ConfigError
from vagent.runconfig import load_config
from vagent.recipes.resume import resume_config, write_new_run_files
from vagent.recipes.run import train
from vagent.runs import read_metrics
from vagent.runs.identity import read_run_identity
from vagent.runs.rundir import new_run_dir

from .conftest import small_overrides

SFT = ["sft.steps=2", "sft.demos_per_env=4", "sft.batch_size=2", "sft.actions_per_turn=1", "update.kl_coef=0.05",
       "log.keep_last=2", "log.checkpoint_every=1"]


def _comparable(run: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith("perf/") and k not in ("time", "val/time_s")}
            for r in read_metrics(run / "metrics.jsonl")]


def test_a_damaged_kl_reference_falls_back_with_the_rl_checkpoints(tmp_path, tiny_vlm):
    finished = train(load_config(None, small_overrides(tmp_path / "a", tiny_vlm, *SFT)), quiet=True)
    run = Path(shutil.copytree(finished, tmp_path / "run"))
    (run / "summary.json").unlink()  # killed after its last checkpoint
    policy = run / "checkpoints" / "sft_000002" / "policy.pt"
    data = bytearray(policy.read_bytes())
    data[len(data) // 2: len(data) // 2 + 64] = bytes(b ^ 0xFF for b in data[len(data) // 2: len(data) // 2 + 64])
    policy.write_bytes(bytes(data))

    train(resume=run, quiet=True)

    log = (run / "train.log").read_text()
    assert "it trained from sft_000002 (its KL reference), which is damaged" in log
    assert "resuming from sft_000001, the newest intact checkpoint" in log
    assert _comparable(run) == _comparable(finished)  # SFT step 2 and both RL steps ran again


@pytest.fixture
def made_run(tmp_path, tiny_vlm):
    """A run directory as a new run writes it (run.json, config.yaml), before any training."""
    cfg = load_config(None, small_overrides(tmp_path, tiny_vlm, "steps=4", "update.actor_lr=3e-4"))
    run = new_run_dir(cfg.out_dir, cfg.name)
    write_new_run_files(run, cfg)
    return run


def _edit(run, **changes) -> None:
    tree = yaml.safe_load(run.config.read_text())
    for dotted, value in changes.items():
        node = tree
        *path, last = dotted.split("__")
        for part in path:
            node = node[part]
        node[last] = value
    run.config.write_text(yaml.safe_dump(tree, sort_keys=False))


def test_an_edited_config_is_refused_listing_each_changed_field(made_run, capsys):
    _edit(made_run, seed=1, update__actor_lr=0.01, model__tiny_hidden=32)
    with pytest.raises(ConfigError) as err:
        resume_config(made_run)
    msg = str(err.value)
    assert "seed: 0 -> 1" in msg and "update.actor_lr: 0.0003 -> 0.01" in msg and "model.tiny_hidden: 128 -> 32" in msg
    assert main(["train", "--resume", str(made_run.root), "--quiet"]) == 1  # before any model work
    assert "differs from the config the run started with" in capsys.readouterr().err
    assert not (made_run.root / "train.log").exists()


def test_an_empty_config_is_refused_never_the_defaults(made_run):
    made_run.config.write_text("")  # what a full disk left when the run directory was made
    with pytest.raises(ConfigError, match="config.yaml is empty .*Resuming would train the default config"):
        resume_config(made_run)


def test_steps_change_only_when_named_and_the_change_is_recorded(made_run):
    _edit(made_run, steps=6)
    with pytest.raises(ConfigError, match="steps: 4 -> 6"):
        resume_config(made_run)  # edited by hand, not named
    with pytest.raises(ConfigError, match="may change only steps"):
        resume_config(made_run, ["seed=3"])
    plan = resume_config(made_run, ["steps=6"])
    assert plan.cfg.steps == 6 and "steps: 4 -> 6" in plan.said[0]
    assert read_run_identity(made_run.root).config["steps"] == 4  # written once the resume is accepted
    plan.accept()
    recorded = read_run_identity(made_run.root)
    assert recorded.changes[-1]["fields"] == {"steps": [4, 6]} and recorded.config["steps"] == 6
    assert yaml.safe_load(made_run.config.read_text())["steps"] == 6
    assert resume_config(made_run).cfg.steps == 6  # accepted once, the run's config from then on
