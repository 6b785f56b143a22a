"""A command that needs a package which is not installed ends with one line naming the install,
never a traceback (``vagent.cli.missing_dependency``, the ``vagent`` entry's handler for every
command). Here: ``vagent play`` and ``vagent demos`` with primitive_skill on ``backend=maniskill``
in an environment without ManiSkill (.venv), as real ``vagent`` processes; and the rule itself:
a bare "No module named" gets the extra of vagent that installs it, while an import of vagent's
own that fails (a bug) keeps its traceback."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

no_maniskill = pytest.mark.skipif(importlib.util.find_spec("mani_skill") is not None,
                                  reason="ManiSkill is installed here: the commands would run")


def vagent(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """The ``vagent`` command of this environment (its console script), as a user runs it."""
    script = Path(sys.executable).with_name("vagent")
    cmd = [str(script)] if script.is_file() else [sys.executable, "-m", "vagent.cli"]
    return subprocess.run([*cmd, *args], cwd=cwd, capture_output=True, text=True, timeout=600)


@no_maniskill
@pytest.mark.parametrize("command", [
    ["play", "primitive_skill", "--config", "backend=maniskill", "--policy", "random"],
    ["demos", "primitive_skill", "demos.jsonl", "--n", "2", "--env", "backend=maniskill"],
])
def test_a_missing_optional_dependency_is_one_line(command, tmp_path):
    done = vagent(*command, cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr
    line = done.stderr.strip()
    assert line.startswith("error: backend='maniskill' needs ManiSkill 3"), line
    assert "pip install 'vagent[maniskill]'" in line and "No module named" in line, line
    assert not (tmp_path / "demos.jsonl").exists()  # a failed `vagent demos` leaves no file behind


def test_a_bare_missing_module_is_named_with_the_extra_that_installs_it():
    from vagent.cli import missing_dependency

    for module, extra in (("sapien", "maniskill"), ("mani_skill.envs", "maniskill"), ("ray", "ray")):
        line = missing_dependency(ModuleNotFoundError(f"No module named {module!r}", name=module))
        assert line == f"No module named {module!r}: this command needs it: pip install 'vagent[{extra}]'"
    line = missing_dependency(ModuleNotFoundError("No module named 'nowhere_pkg'", name="nowhere_pkg"))
    assert line == ("No module named 'nowhere_pkg': this command needs it: install the package that provides "
                    "'nowhere_pkg'")


def test_an_import_of_vagent_itself_that_fails_is_a_bug_and_keeps_its_traceback():
    from vagent.cli import missing_dependency

    assert missing_dependency(ModuleNotFoundError("No module named 'vagent.nope'", name="vagent.nope")) is None
    assert missing_dependency(ImportError("cannot import name 'X' from 'vagent.runs'", name="vagent.runs")) is None
    # an installed package of another version: not a missing one
    assert missing_dependency(ImportError("cannot import name 'X' from 'transformers'", name="transformers")) is None
    try:  # vagent's own message naming the install, raised from the missing module
        try:
            raise ModuleNotFoundError("No module named 'sapien'", name="sapien")
        except ModuleNotFoundError as exc:
            raise ImportError("backend='maniskill' needs ManiSkill 3: pip install 'vagent[maniskill]'") from exc
    except ImportError as exc:
        assert missing_dependency(exc) == "backend='maniskill' needs ManiSkill 3: pip install 'vagent[maniskill]'"
