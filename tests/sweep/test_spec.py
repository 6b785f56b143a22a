"""Sweep files: rows (variants x grid), trial configs, and the errors a bad file gets."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from vagent.config import ConfigError
from vagent.sweep.spec import load_sweep


def _write(tmp_path: Path, **fields) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"name": "s", **fields}, sort_keys=False))
    return path


def test_variants_cross_the_grid_and_every_trial_has_its_config(tmp_path):
    rule = {"judge": "rule", "grounding_weight": 0.5, "worldmodeling_weight": 0.5}
    sweep = load_sweep(_write(
        tmp_path, overrides={"steps": 3},
        variants={"no_think": {"envs.0.config.format": "no_think"}, "gwm": {}},
        grid={"ppo.estimator": ["masked_gae", "bi_level_gae"], "reasoning_reward": {"off": None, "rule": rule}},
        seeds=[3, 5], baseline="gwm,estimator=bi_level_gae,reasoning_reward=off"))
    names = [r.name for r in sweep.rows]
    assert names[:2] == ["no_think,estimator=masked_gae,reasoning_reward=off",
                         "no_think,estimator=masked_gae,reasoning_reward=rule"]
    assert len(names) == 8 and len(sweep.trials) == 16
    row = "no_think,estimator=bi_level_gae,reasoning_reward=rule"
    t = next(t for t in sweep.trials if t.row == row and t.seed == 5)
    assert t.trial_id == "no_think,estimator=bi_level_gae,reasoning_reward=rule/seed_5"
    c = t.config
    assert (c["seed"], c["steps"], c["ppo"]["estimator"], c["reasoning_reward"]) == (5, 3, "bi_level_gae", rule)
    assert c["envs"][0]["config"]["format"] == "no_think"
    assert c["envs"][0]["config"]["reward_progress"] == 0.5  # the rest of the default preset is kept
    assert c["name"] == "no_think,estimator=bi_level_gae,reasoning_reward=rule-s5"
    gwm = next(t for t in sweep.trials if t.row.startswith("gwm,") and t.seed == 3)
    assert gwm.config["envs"][0]["config"]["format"] == "grounding_worldmodeling"
    assert sweep.fingerprint() == load_sweep(tmp_path / "s.yaml").fingerprint()


def test_base_is_relative_to_the_sweep_file(tmp_path):
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "base.yaml").write_text("recipe: ppo\nsteps: 7\nenvs: [{name: frozenlake, n_val: 3}]\n")
    sweep = load_sweep(_write(tmp_path, base="runs/base.yaml", seeds=[0]))
    assert [r.name for r in sweep.rows] == ["base"] and sweep.baseline == "base"
    assert sweep.trials[0].config["steps"] == 7 and sweep.trials[0].config["envs"][0]["n_val"] == 3


@pytest.mark.parametrize("fields, message", [
    ({"grid": {"ppo.estimatr": ["masked_gae"]}},
     "sweep row 'estimatr=masked_gae': override 'ppo.estimatr': unknown key 'estimatr' in PPOConfig. "
     "Did you mean 'estimator'?"),
    ({"grid": {"ppo.estimator": ["nope"]}}, "sweep row 'estimator=nope': config.ppo.estimator: expected one of"),
    ({"overrides": {"seed": 3}}, "sweep key 'seed' is set by the sweep itself"),
    ({"grid": {"steps": 3}}, "sweep grid.steps: expected a list of values or a mapping of label -> value, got 3"),
    ({"seeds": []}, "sweep seeds must be a non-empty list of distinct integers, got []"),
    ({"seeds": [1, 1]}, "distinct integers, got [1, 1]"),
    ({"baseline": "x", "grid": {"steps": [1, 2]}}, "sweep baseline 'x' is not a row; rows: steps=1, steps=2"),
    ({"base": "missing.yaml"}, "sweep base 'missing.yaml': no file at"),
    ({"variants": {"a": {"steps": 1}}, "grid": {"steps": {"a": 2}}, "seedz": [1]},
     "sweep: unknown key 'seedz'. Did you mean 'seeds'?"),
    ({"resources": {"cpu": 0}}, "sweep resources must hold a CPU or a GPU"),
])
def test_bad_sweep_files_say_what_to_fix(tmp_path, fields, message):
    with pytest.raises(ConfigError) as info:
        load_sweep(_write(tmp_path, **fields))
    assert message in str(info.value)


def test_missing_sweep_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist. Pass a sweep YAML file"):
        load_sweep(tmp_path / "nope.yaml")


def test_the_ablation_sweep_file_loads():
    sweep = load_sweep(Path(__file__).resolve().parents[2] / "configs" / "sweeps" / "vagent_ablation.yaml")
    assert len(sweep.config.seeds) >= 4
    formats = {t.config["envs"][0]["config"]["format"] for t in sweep.trials}
    assert formats == {"no_think", "free_think", "grounding_worldmodeling"}
    assert {t.config["ppo"]["estimator"] for t in sweep.trials} == {"masked_gae", "bi_level_gae"}
    assert {(t.config["reasoning_reward"] or {}).get("judge") for t in sweep.trials} == {None, "rule"}
    assert sweep.baseline in [r.name for r in sweep.rows]
