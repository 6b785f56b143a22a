"""docs/custom_env.md, followed literally: its module template saved as a package module, then the
guide's own commands as written (``vagent envs``, ``vagent play`` in a fresh process, ``vagent demos``,
its scaled-down ``vagent train``), parsed from the markdown, and its Python snippet."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "custom_env.md"


def guide_module() -> str:
    """The first ```python block of the guide (the module template)."""
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), flags=re.S)
    assert blocks and 'register("corridor"' in blocks[0], "the guide's first python block is the template"
    return blocks[0]


@pytest.fixture
def corridor_pkg(tmp_path, monkeypatch):
    pkg = tmp_path / "mypackage"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "corridor.py").write_text(guide_module())
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    from vagent.envs import registry

    registry._REGISTRY.pop("corridor", None)
    for name in [m for m in sys.modules if m == "mypackage" or m.startswith("mypackage.")]:
        del sys.modules[name]


def vagent(*args: str, cwd: Path, timeout: float = 120, **environ: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2]), **environ}
    return subprocess.run([sys.executable, "-m", "vagent", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def guide_commands(verb: str) -> list[list[str]]:
    """The guide's ``vagent VERB ...`` commands (fenced shell blocks, continuations joined), as argv."""
    from tests.test_docs import extract_commands

    root = GUIDE.parents[1]
    return [shlex.split(c.text)[1:] for c in extract_commands(GUIDE, root) if c.text.startswith(f"vagent {verb} ")]


def test_guide_commands(corridor_pkg, capsys):
    """The guide's envs / play / demos commands, as written."""
    from vagent.cli import main

    # `vagent play` in a fresh process: the import happens there, not in this test's process
    (play,) = guide_commands("play")
    out = vagent(*play, cwd=corridor_pkg)
    assert out.returncode == 0, out.stderr
    assert "episode over: success=True" in out.stdout

    (envs,) = guide_commands("envs")
    assert main(envs) == 0
    shown = capsys.readouterr().out
    assert "corridor: Corridor: walk right along a corridor to the exit." in shown
    assert "length (int, default 6)" in shown

    (demos,) = guide_commands("demos")
    assert main(demos) == 0
    written = corridor_pkg / "demos" / "corridor.jsonl"
    assert [json.loads(line)["meta"]["success"] for line in written.read_text().splitlines()] == [True] * 8
    assert sorted(p.name for p in written.parent.iterdir()) == ["corridor.jsonl"]  # a text env: no image folder

    assert main(["play", "corridor", "--import", "mypackage.nothere"]) == 2
    assert "no module named 'mypackage.nothere'" in capsys.readouterr().err


def test_guide_python_snippet(corridor_pkg):
    """The guide's "In Python" block, run as a script from the folder that holds mypackage/."""
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), flags=re.S)
    (snippet,) = [b for b in blocks if "check_env(" in b]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    out = subprocess.run([sys.executable, "-c", snippet], cwd=corridor_pkg, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert "determinism in a fresh process" in out.stdout


def test_unknown_env_names_import(corridor_pkg, capsys):
    """What a user sees when the env's module was not imported, or the name is misspelt."""
    from vagent.cli import main

    out = vagent("envs", "corridor", cwd=corridor_pkg)  # a fresh process: nothing registered
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert "Unknown env 'corridor'." in out.stderr and "pass --import MODULE" in out.stderr
    assert main(["envs", "corridr", "--import", "mypackage.corridor"]) == 2
    err = capsys.readouterr().err
    assert "Unknown env 'corridr'. Did you mean 'corridor'?" in err and "pass --import MODULE" in err


def test_guide_train_command(corridor_pkg):
    """The guide's ``vagent train`` as written, in a fresh process (the preset's ``threads: 2`` stays
    there), on the default preset's tiny model built under an empty HOME's ~/.cache/vagent: it
    updates the actor and validates."""
    from vagent.runconfig import load_config

    (train,) = guide_commands("train")
    out = vagent(*train, cwd=corridor_pkg, HOME=str(corridor_pkg / "home"), timeout=1800)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    (run,) = (corridor_pkg / "runs").iterdir()
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    updated = {r["step"]: r["actor/updated"] for r in records if r.get("phase") == "rl" and "actor/updated" in r}
    assert updated == {1: 0.0, 2: 0.0, 3: 1.0}
    assert [r["step"] for r in records if "val/corridor/success_rate" in r] == [0, 3]
    saved = load_config(run / "config.yaml")  # --resume reads this: the import is kept
    assert saved.imports == ["mypackage.corridor"] and saved.envs[0].name == "corridor"


def test_imports_in_run_config(corridor_pkg):
    from vagent.config import ConfigError
    from vagent.envs import list_envs
    from vagent.runconfig import load_config

    cfg = load_config(None, ["imports=[mypackage.corridor]", "envs.0.name=corridor", "envs.0.config={}"])
    assert "corridor" in list_envs() and cfg.imports == ["mypackage.corridor"]
    with pytest.raises(ConfigError, match="imports: .*no module named 'nothere'.*PYTHONPATH"):
        load_config(None, ["imports=[nothere]"])
