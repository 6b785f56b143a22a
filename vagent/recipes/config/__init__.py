"""The declared run config (moved from recipes/config.py and recipes/config_checks.py; split next)."""

from vagent.config import ConfigError
from vagent.recipes.config.ranges import (
    RANGES, Range, check_name, check_out_dir, check_ranges, class_default, ranges_markdown, read_config_text,
)
from vagent.recipes.config.sections import *  # noqa: F401,F403
from vagent.recipes.config.sections import _field_class  # noqa: F401
