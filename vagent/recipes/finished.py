"""Is a run directory finished? Light (no torch): ``vagent train --resume`` of a finished run says
so before torch and the recipes load, in one process, in each rank of a job and in the launcher.

A finished run does not train again, so a resume of it with overrides that would change its
config (``steps=60``) is an error, not a success that did nothing: a script must not take exit
status 0 for training that never ran. An unknown key or a bad value is the config's own error."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Sequence


def finished(root: Path, quiet: bool, overrides: Sequence[str] = ()) -> bool:
    """Does the run have summary.json (written last: nothing is left to do)? Says so unless quiet.
    ConfigError when ``overrides`` ask it for something (:func:`check_finished_overrides`)."""
    if not (root / "summary.json").is_file():
        return False
    check_finished_overrides(root, overrides)
    if not quiet:
        print(f"{root} is finished (it has summary.json); nothing to resume, nothing changed. "
              "Start a new run to train further.", flush=True)
    return True


def check_finished_overrides(root: Path, overrides: Sequence[str]) -> None:
    """ConfigError when resume overrides of the finished run ``root`` are not its config.yaml's
    values: ``steps`` above the steps it trained says how to continue it; any other change says it
    had no effect."""
    if not overrides:
        return
    from vagent.config import ConfigError
    from vagent.runconfig import load_config, parse_override

    saved = load_config(root / "config.yaml")
    wanted = load_config(root / "config.yaml", list(overrides))  # an unknown key or a bad value raises here
    old, new = dataclasses.asdict(saved), dataclasses.asdict(wanted)
    changed = [o for o in overrides if _at(old, parse_override(o)[0]) != _at(new, parse_override(o)[0])]
    if not changed:
        return
    if wanted.recipe != "sft" and wanted.steps > saved.steps:
        raise ConfigError(f"{root} is finished (it has summary.json: all {saved.steps} steps trained); it was not "
                          f"resumed and nothing changed, so steps={wanted.steps} trained nothing. To train it further, "
                          f"move {root / 'summary.json'} out of the run directory: then vagent train --resume {root} "
                          f"steps={wanted.steps} continues from its last checkpoint.")
    raise ConfigError(f"{root} is finished (it has summary.json); it was not resumed and nothing changed, so "
                      f"{' '.join(changed)} had no effect: a finished run does not train again. Start a new run "
                      f"(vagent train --config {root / 'config.yaml'} ...) for another config.")


def _at(tree: Any, parts: list[str]) -> Any:
    """The value at a dotted override path in a config as plain data (None where there is none)."""
    for part in parts:
        try:
            tree = tree[int(part)] if isinstance(tree, list) else tree[part]
        except (KeyError, IndexError, ValueError, TypeError):
            return None
    return tree
