"""docs/custom_env.md, followed literally: its module template saved as a package module, then
``vagent envs``, ``vagent play`` and ``vagent demos`` (fresh processes) and a two-step
``vagent train`` (in process, on the tiny VLM) with ``--import``."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.recipes.conftest import small_overrides

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


def vagent(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    return subprocess.run([sys.executable, "-m", "vagent", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


def test_guide_commands(corridor_pkg, capsys):
    from vagent.cli import main

    # `vagent play` in a fresh process: the import happens there, not in this test's process
    out = vagent("play", "corridor", "--import", "mypackage.corridor", "--policy", "solver", "--seed", "3",
                 cwd=corridor_pkg)
    assert out.returncode == 0, out.stderr
    assert "episode over: success=True" in out.stdout

    assert main(["envs", "corridor", "--import", "mypackage.corridor"]) == 0
    shown = capsys.readouterr().out
    assert "corridor: Corridor: walk right along a corridor to the exit." in shown
    assert "length (int, default 6)" in shown

    demos = corridor_pkg / "demos" / "corridor.jsonl"
    assert main(["demos", "corridor", str(demos), "--n", "2", "--import", "mypackage.corridor"]) == 0
    assert [json.loads(line)["meta"]["success"] for line in demos.read_text().splitlines()] == [True, True]

    assert main(["play", "corridor", "--import", "mypackage.nothere"]) == 2
    assert "no module named 'mypackage.nothere'" in capsys.readouterr().err


def test_without_import_the_env_is_unknown(tmp_path):
    """What the guide's users hit before --import existed (a fresh process: nothing registered)."""
    out = vagent("envs", "corridor", cwd=tmp_path)
    assert out.returncode != 0 and "Unknown env 'corridor'" in out.stderr


def test_guide_two_step_train(corridor_pkg, tiny_vlm):
    from vagent.cli import main
    from vagent.recipes.config import load_config

    args = small_overrides(corridor_pkg, tiny_vlm, "envs.0.name=corridor", "envs.0.config={}")
    assert main(["train", "--import", "mypackage.corridor", "--quiet", *args]) == 0
    run = next((corridor_pkg / "runs").iterdir())
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r.get("phase") == "rl" and "loss/policy" in r] == [1, 2]
    saved = load_config(run / "config.yaml")  # --resume reads this: the import is kept
    assert saved.imports == ["mypackage.corridor"] and saved.envs[0].name == "corridor"


def test_imports_in_run_config(corridor_pkg):
    from vagent.config import ConfigError
    from vagent.envs import list_envs
    from vagent.recipes.config import load_config

    cfg = load_config(None, ["imports=[mypackage.corridor]", "envs.0.name=corridor", "envs.0.config={}"])
    assert "corridor" in list_envs() and cfg.imports == ["mypackage.corridor"]
    with pytest.raises(ConfigError, match="imports: .*no module named 'nothere'.*PYTHONPATH"):
        load_config(None, ["imports=[nothere]"])
