"""The declared run config: one dataclass tree, one YAML file per run, ``key=value`` overrides.

A run config is a :class:`RunConfig`; every field is documented by the ``#:`` comment above it
(``vagent train --describe`` prints them, ``docs/configuration.md`` lists them). Unknown keys are
errors with a "did you mean" (``vagent.config.from_mapping``). Overrides on the command line are
dotted paths into the tree, with list indices as numbers::

    vagent train --config configs/frozenlake_ppo.yaml steps=20 ppo.estimator=turn_gae \\
        envs.0.config.render=text update.actor_lr=3e-4

Values are parsed as YAML scalars (``true``, ``3e-4``, ``[1, 2]``, ``null``). The resolved config
is printed at start-up and saved as ``config.yaml`` in the run directory; ``--resume`` reads it
back from there.

The modules, each importing only the ones above it:

- :mod:`.sections` the dataclasses (``ModelConfig`` ... ``RunConfig``) and the estimator Literals
- :mod:`.ranges` every number's range, the run name, the config file's encoding, the output folder
- :mod:`.validate` the rules between fields (:func:`validate`) and the env entries (:func:`validate_envs`)
- :mod:`.presets` the configs/ folder and the default run (:data:`DEFAULT_PRESET_YAML`)
- :mod:`.load` overrides and :func:`load_config`
- :mod:`.describe` ``vagent train --describe``, docs/configuration.md's tables, the config as YAML
"""

from vagent.config import ConfigError
from vagent.runconfig.describe import (
    config_to_yaml,
    configuration_markdown,
    default_run_value,
    describe_all,
    describe_rows,
)
from vagent.runconfig.load import default_run_name, field_class, load_config, parse_override
from vagent.runconfig.presets import DEFAULT_PRESET_YAML, default_preset_dict, preset_dir, training_presets
from vagent.runconfig.ranges import (
    RANGES,
    Range,
    check_name,
    check_out_dir,
    check_ranges,
    class_default,
    ranges_markdown,
    read_config_text,
)
from vagent.runconfig.sections import (
    DistConfig,
    EnvEntry,
    GRPOConfig,
    GRPOEstimator,
    HubConfig,
    LogConfig,
    ModelConfig,
    PPOConfig,
    PPOEstimator,
    RolloutConfig,
    RolloutCorrectionConfig,
    RunConfig,
    SFTConfig,
    UpdateConfig,
    ValConfig,
)
from vagent.runconfig.validate import PRETRAIN_ENV_DEFAULTS, pretrain_env_entries, validate, validate_envs

__all__ = [
    "ConfigError",
    # sections
    "DistConfig", "EnvEntry", "GRPOConfig", "GRPOEstimator", "HubConfig", "LogConfig", "ModelConfig", "PPOConfig",
    "PPOEstimator", "RolloutConfig", "RolloutCorrectionConfig", "RunConfig", "SFTConfig", "UpdateConfig", "ValConfig",
    # ranges
    "RANGES", "Range", "check_name", "check_out_dir", "check_ranges", "class_default", "ranges_markdown",
    "read_config_text",
    # validate
    "PRETRAIN_ENV_DEFAULTS", "pretrain_env_entries", "validate", "validate_envs",
    # presets
    "DEFAULT_PRESET_YAML", "default_preset_dict", "preset_dir", "training_presets",
    # load
    "default_run_name", "field_class", "load_config", "parse_override",
    # describe
    "config_to_yaml", "configuration_markdown", "default_run_value", "describe_all", "describe_rows",
]
