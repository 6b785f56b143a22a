"""scripts/make-venv: the README's venvs go on an optimized interpreter when python3 is a build
without optimizations and the distribution's is there; an override, a kept venv and bad input
each get one line."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "make-venv"


def _load():
    loader = importlib.machinery.SourceFileLoader("make_venv", str(SCRIPT))
    spec = importlib.util.spec_from_loader("make_venv", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


mv = _load()
PYENV = mv.Interp("/root/.pyenv/versions/3.11.7/bin/python3", (3, 11, 7), "'--prefix=/root/.pyenv' '--enable-shared'",
                  True)
DISTRO = mv.Interp("/usr/bin/python3", (3, 11, 2), "'--enable-shared' '--prefix=/usr'", True)


def test_an_unoptimized_python3_gives_way_to_the_distributions_and_says_why():
    pick, why = mv.choose(PYENV, DISTRO)
    assert pick == DISTRO
    assert PYENV.executable in why and "--enable-optimizations" in why and "VAGENT_PYTHON=python3" in why


@pytest.mark.parametrize("current, system", [
    (PYENV._replace(config_args="'--enable-optimizations' '--with-lto'"), DISTRO),  # an optimized build
    (DISTRO._replace(executable="/usr/bin/python3.12", version=(3, 12, 3)), DISTRO),  # already the distribution's
    (PYENV, None),  # no /usr/bin/python3
    (PYENV, DISTRO._replace(venv=False)),  # Debian without python3-venv
    (PYENV, DISTRO._replace(version=(3, 9, 2))),  # too old for vagent
    (PYENV, PYENV),  # the same interpreter
], ids=["optimized", "distribution", "no-system", "system-without-venv", "system-too-old", "same"])
def test_python3_is_kept_otherwise(current, system):
    assert mv.choose(current, system) == (current, "python3")


def _run(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env={**os.environ, **env})


def test_a_named_interpreter_makes_the_venv_and_an_existing_venv_is_kept(tmp_path):
    made = _run(tmp_path, "v", VAGENT_PYTHON=sys.executable)
    assert made.returncode == 0, made.stderr
    assert made.stderr.startswith("make-venv: v on ") and made.stderr.strip().endswith(": VAGENT_PYTHON"), made.stderr
    base = subprocess.run([str(tmp_path / "v" / "bin" / "python"), "-c", "import sys; print(sys._base_executable, "
                           "sys.prefix != sys.base_prefix)"], capture_output=True, text=True, check=True).stdout.split()
    assert os.path.realpath(base[0]) == os.path.realpath(sys._base_executable) and base[1] == "True"
    (tmp_path / "v" / "marker").write_text("mine")
    again = _run(tmp_path, "v")  # kept, not rebuilt on another interpreter
    assert again.returncode == 0 and again.stderr.strip().endswith(": kept"), again.stderr
    assert (tmp_path / "v" / "marker").read_text() == "mine"


def test_bad_input_is_one_line_and_makes_nothing(tmp_path):
    wrong = _run(tmp_path, "v", VAGENT_PYTHON="no-such-python")
    assert wrong.returncode == 1 and "VAGENT_PYTHON='no-such-python' does not run" in wrong.stderr
    assert len(wrong.stderr.strip().splitlines()) == 1 and not (tmp_path / "v").exists()
    usage = _run(tmp_path, "--help")
    assert usage.returncode == 2 and usage.stderr.startswith("usage: scripts/make-venv")
    (tmp_path / "broken" / "bin").mkdir(parents=True)
    (tmp_path / "broken" / "bin" / "python").symlink_to(tmp_path / "gone")
    broken = _run(tmp_path, "broken")
    assert broken.returncode == 1 and "rm -rf broken" in broken.stderr, broken.stderr
