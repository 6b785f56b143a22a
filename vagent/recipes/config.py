"""The run config's old name: ``vagent.recipes.config`` and its modules
(``vagent.recipes.config.sections`` ...) are :mod:`vagent.runconfig`'s, the same module objects, so
code written against the old name keeps working. New code imports :mod:`vagent.runconfig`."""

import importlib
import sys

from vagent import runconfig

for _name in ("describe", "load", "presets", "ranges", "sections", "validate"):
    sys.modules[f"{__name__}.{_name}"] = importlib.import_module(f"vagent.runconfig.{_name}")
sys.modules[__name__] = runconfig
