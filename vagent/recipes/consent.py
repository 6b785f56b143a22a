"""The code a run directory names, and the user's consent to run it. Light (no torch).

A run directory is data. Its ``config.yaml`` can still name code: ``imports`` (modules imported
as the run starts, to register its envs) and ``model.trust_remote_code: true`` (the model
directory's own Python files). A new run's config is the user's own; a resumed run's was written
by whoever wrote the directory. So ``vagent train --resume`` runs that code only when the command
line names it again (``--import MODULE`` for each module, ``--trust-remote-code``), and refuses
in one line otherwise, before anything is imported (:func:`check_run_code`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from vagent.config import ConfigError
from vagent.runconfig.ranges import read_config_text


@dataclass(frozen=True)
class CodeConsent:
    """The code a user vouches for on a resume's command line: the ``--import`` modules and
    ``--trust-remote-code``. A run directory is data: the code its ``config.yaml`` names (its
    ``imports``, ``model.trust_remote_code: true``) runs only when the user names it again."""

    imports: tuple[str, ...] = ()
    trust_remote_code: bool = False


def check_run_code(config: Path, consent: CodeConsent = CodeConsent(), command: str = "") -> None:
    """ConfigError (one line) when the run config ``config`` names code that ``consent`` does not:
    a module in ``imports`` not named with ``--import``, or ``model.trust_remote_code: true``
    without ``--trust-remote-code``. Reads the YAML as data (nothing is imported); a file that
    cannot be read is left to the resume's own checks. ``command``: the command the fix repeats
    with the flags added (default: ``vagent train --resume RUN``)."""
    try:
        tree = yaml.safe_load(read_config_text(config))
    except (ConfigError, OSError, yaml.YAMLError):
        return
    if not isinstance(tree, dict):
        return
    imports, model = tree.get("imports"), tree.get("model")
    unnamed = [str(m) for m in imports if str(m) not in consent.imports] if isinstance(imports, list) else []
    remote = isinstance(model, dict) and model.get("trust_remote_code") is True and not consent.trust_remote_code
    if not unnamed and not remote:
        return
    what = ([f"imports {', '.join(unnamed)} (imported as the run starts)"] if unnamed else []) + \
        (["model.trust_remote_code true (the model directory's own Python files)"] if remote else [])
    flags = " ".join([*(f"--import {m}" for m in unnamed), *(["--trust-remote-code"] if remote else [])])
    command = command or f"vagent train --resume {config.parent}"
    raise ConfigError(f"{config} names code that {command.split(' --')[0]} would run: {' and '.join(what)}. A run "
                      "directory is data, and vagent runs the code it names only when you name it too: if you trust "
                      f"it, run {command} {flags}")
