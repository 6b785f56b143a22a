"""Config inputs closed before any model work (issue 47, findings 7-8): NaN/inf and unknown keys
in reasoning_reward, a temperature that overflows, a YAML alias bomb or a huge file, run names too
long or not UTF-8, YAML booleans for tri-state fields; each a one-line ConfigError at load."""

from __future__ import annotations

import time

import pytest

from vagent.config import ConfigError
from vagent.runconfig import load_config


@pytest.mark.parametrize("value", [".nan", ".inf"])
def test_reasoning_reward_weights_must_be_finite(value):
    with pytest.raises(ConfigError, match="reasoning_reward.grounding_weight must be a finite number"):
        load_config(None, [f"reasoning_reward={{grounding_weight: {value}}}"])


def test_unknown_reasoning_reward_key_fails_at_load():
    with pytest.raises(ConfigError, match="grounding_wieght"):
        load_config(None, ["reasoning_reward={grounding_wieght: 0.5}"])


def test_a_temperature_that_overflows_is_refused():
    with pytest.raises(ConfigError, match="rollout.temperature must be 0 \\(greedy\\) or >= 0.001"):
        load_config(None, ["rollout.temperature=1e-320"])
    assert load_config(None, ["rollout.temperature=0"]).rollout.temperature == 0


def test_a_yaml_alias_bomb_is_refused_quickly(tmp_path):
    levels = ["a: &a [x, x, x, x, x, x, x, x, x]"]
    for i, name in enumerate("bcdefghi"):
        prev = "abcdefghi"[i]
        levels.append(f"{name}: &{name} [*{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}]")
    f = tmp_path / "bomb.yaml"
    f.write_text("\n".join(levels) + "\nname: *i\n")
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match="expands to more than 100000 values"):
        load_config(f)
    assert time.perf_counter() - t0 < 5


def test_a_huge_config_file_is_refused(tmp_path):
    f = tmp_path / "huge.yaml"
    f.write_text("# " + "x" * (2 << 20) + "\nsteps: 2\n")
    with pytest.raises(ConfigError, match="larger than 1 MB"):
        load_config(f)


def test_run_names_are_bounded_and_utf8():
    with pytest.raises(ConfigError, match="at most 200 fit"):
        load_config(None, ["name=" + "n" * 300])
    with pytest.raises(ConfigError, match="not valid UTF-8"):
        load_config({"name": "run\udc80"})


def test_yaml_booleans_fill_tri_state_fields(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("bf16: false\n")
    assert load_config(f).bf16 == "false"
    assert load_config(None, ["bf16=true"]).bf16 == "true"
