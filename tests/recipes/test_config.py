"""The declared run config: unknown keys, overrides, presets, the embedded default, saving."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from vagent.config import ConfigError, field_docs, to_dict
from vagent import runconfig as C
from vagent.runconfig import RunConfig, config_to_yaml, load_config

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def test_unknown_keys_are_errors_with_did_you_mean(tmp_path):
    f = tmp_path / "x.yaml"
    f.write_text("name: x\nrolout: {group_size: 2}\n")
    with pytest.raises(ConfigError, match="unknown key 'rolout'.*Did you mean 'rollout'"):
        load_config(f)
    with pytest.raises(ConfigError, match="unknown key 'estimatr'.*Did you mean 'estimator'"):
        load_config(None, ["ppo.estimatr=turn_gae"])
    with pytest.raises(ConfigError, match="expected one of"):
        load_config(None, ["ppo.estimator=gae"])
    with pytest.raises(ConfigError, match="key=value"):
        load_config(None, ["steps"])


def test_overrides_reach_nested_fields_and_lists():
    cfg = load_config(None, ["steps=7", "update.actor_lr=3e-4", "envs.0.config.render=text",
                             "envs.0.n_train=3", "rollout.window=2", "model.lora_rank=8"])
    assert cfg.steps == 7 and cfg.update.actor_lr == 3e-4 and cfg.rollout.window == 2
    assert cfg.envs[0].config["render"] == "text" and cfg.envs[0].n_train == 3 and cfg.model.lora_rank == 8
    with pytest.raises(ConfigError, match="index below 1"):
        load_config(None, ["envs.3.n_train=2"])


def test_cross_field_rules_name_the_fix():
    with pytest.raises(ConfigError, match="ppo.estimator=no_concat_gae"):
        load_config(None, ["rollout.mode=no_concat"])
    with pytest.raises(ConfigError, match="group_size >= 2"):
        load_config(None, ["recipe=grpo"])
    with pytest.raises(ConfigError, match="kl_in=loss"):
        load_config(None, ["recipe=grpo", "rollout.group_size=4", "update.kl_coef=0.01", "update.kl_in=reward"])


PRESETS = ("frozenlake_ppo.yaml", "sokoban_ppo.yaml", "frozenlake_grpo.yaml")  # the training presets


@pytest.mark.parametrize("name", PRESETS)
def test_presets_load(name):
    cfg = load_config(CONFIGS / name)
    assert isinstance(cfg, RunConfig) and cfg.envs


def test_embedded_default_equals_the_preset_file():
    assert yaml.safe_load(C.DEFAULT_PRESET_YAML) == yaml.safe_load((CONFIGS / "frozenlake_ppo.yaml").read_text())
    assert to_dict(load_config(None)) == to_dict(load_config(CONFIGS / "frozenlake_ppo.yaml"))


def test_resolved_config_round_trips(tmp_path):
    cfg = load_config(None, ["steps=3", "envs.0.config.render=text", "rollout.window=1"])
    (tmp_path / "config.yaml").write_text(config_to_yaml(cfg))
    assert to_dict(load_config(tmp_path / "config.yaml")) == to_dict(cfg)


def test_every_field_is_documented():
    import dataclasses

    for cls in (C.RunConfig, C.ModelConfig, C.EnvEntry, C.RolloutConfig, C.RolloutCorrectionConfig, C.UpdateConfig,
                C.PPOConfig, C.GRPOConfig, C.SFTConfig, C.ValConfig, C.LogConfig, C.DistConfig):
        docs = field_docs(cls)
        missing = [f.name for f in dataclasses.fields(cls) if not docs.get(f.name)]
        assert not missing, f"{cls.__name__} fields without a #: comment: {missing}"


def test_configuration_doc_lists_every_field():
    doc = (CONFIGS.parent / "docs" / "configuration.md").read_text()
    assert C.configuration_markdown() in doc, "docs/configuration.md is stale: regenerate its field tables " \
        "from vagent.runconfig.configuration_markdown()"


def test_env_declared_stop_strings_join_the_rollout_stop():
    """vigorl_zoom replies end at </tool_call> too: the run's sampling stops there (no tokens after
    a tool call are sampled or trained on); envs without reply_stop add nothing."""
    from vagent.recipes.common import sampling_for
    plain = load_config(None, [])
    assert sampling_for(plain, 0).stop == ("</answer>",)
    zoom = load_config(str(C.preset_dir() / "vigorl_zoom_grpo.yaml"), [])
    assert sampling_for(zoom, 0).stop == ("</answer>", "</tool_call>")
    assert sampling_for(zoom, 0, greedy=True).stop == ("</answer>", "</tool_call>")


def test_missing_config_lists_only_training_presets():
    """configs/eval_example.yaml is a `vagent eval` config: the presets a missing --config names are
    the run configs, each loadable."""
    from vagent.config import ConfigError

    with pytest.raises(ConfigError) as info:
        load_config("my_run.yaml")
    listed = str(info.value).split("(presets: ")[1].rstrip(").").split(", ")
    assert "frozenlake_ppo" in listed and "eval_example" not in listed
    for name in listed:
        load_config(str(C.preset_dir() / f"{name}.yaml"))


def test_training_guide_defines_my_run_yaml():
    """docs/training.md's real-checkpoint commands use my_run.yaml: the guide defines it, and it loads
    with the commands' override (no model is loaded here)."""
    import re

    guide = (CONFIGS.parent / "docs" / "training.md").read_text()
    (block,) = [b for b in re.findall(r"```yaml\n(.*?)```", guide, flags=re.S) if b.startswith("# my_run.yaml")]
    assert "vagent train --config my_run.yaml model.path=Qwen/Qwen2.5-VL-3B-Instruct" in guide
    cfg = load_config(yaml.safe_load(block), ["model.path=Qwen/Qwen2.5-VL-3B-Instruct"])
    assert cfg.sft.steps == 0 and cfg.device == "cuda" and cfg.update.actor_lr == 1e-6


def test_loss_agg_is_checked_at_load_and_the_dead_value_coef_is_gone():
    with pytest.raises(ConfigError) as err:  # a typo fails here, not at the first update after SFT
        load_config(None, ["update.loss_agg=token_mean"])
    assert "token-mean" in str(err.value) and "seq-mean-token-mean" in str(err.value)
    assert load_config(None, ["update.loss_agg=seq-mean-token-sum"]).update.loss_agg == "seq-mean-token-sum"
    with pytest.raises(ConfigError, match="value_coef"):  # documented once, read nowhere: removed
        load_config(None, ["ppo.value_coef=0.5"])


def test_accumulation_weight_refuses_an_unknown_aggregation():
    import torch

    from vagent.recipes.batching import accumulation_weight

    mask = torch.ones(2, 3)
    assert accumulation_weight(mask[:1], mask, "token-mean") == 0.5
    with pytest.raises(ValueError, match="token-mean"):
        accumulation_weight(mask[:1], mask, "token_mean")  # was silently a sequence mean
