"""A run directory is data: the code its ``config.yaml`` names (``imports``, ``model.trust_remote_code``)
runs on ``--resume`` only when the command line names it again (vagent.recipes.consent)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from vagent.config import ConfigError
from vagent.recipes.consent import CodeConsent, check_run_code


def _run_dir(tmp_path: Path, marker: Path, remote: bool = False) -> Path:
    """A run directory whose config imports ``planted`` (a module that writes ``marker`` when imported)."""
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "planted.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("imports: [planted]\nsteps: 2\n"
                                     + ("model:\n  trust_remote_code: true\n" if remote else ""))
    return run


def test_code_a_run_config_names_needs_the_users_consent(tmp_path):
    run = _run_dir(tmp_path, tmp_path / "RAN", remote=True)
    with pytest.raises(ConfigError, match=r"imports planted .* and model.trust_remote_code true") as e:
        check_run_code(run / "config.yaml")
    assert "--import planted --trust-remote-code" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="trust_remote_code"):
        check_run_code(run / "config.yaml", CodeConsent(("planted",)))
    check_run_code(run / "config.yaml", CodeConsent(("planted",), trust_remote_code=True))  # named: accepted
    (run / "config.yaml").write_text("steps: 2\nimports: []\n")
    check_run_code(run / "config.yaml")  # no code named: nothing to consent to


@pytest.mark.parametrize("finished", [False, True], ids=["unfinished", "finished"])
def test_a_resume_does_not_import_what_the_run_config_names(tmp_path, finished):
    marker = tmp_path / "RAN"
    run = _run_dir(tmp_path, marker)
    if finished:
        (run / "summary.json").write_text("{}")
    env = {"PYTHONPATH": str(tmp_path / "mods"), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-m", "vagent", "train", "--resume", str(run), "steps=3"],
                         capture_output=True, text=True, env=env, timeout=120)
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode != 0 and not marker.exists(), (out.stdout, out.stderr)
    assert len(lines) == 1 and "--import planted" in lines[0] and "names code" in lines[0], lines


def test_eval_of_a_run_does_not_import_what_its_config_names(tmp_path):
    """``vagent eval RUN`` reads the run's config.yaml (its envs, validation seeds): a config that
    imports a module is refused in one line unless ``--import`` names it."""
    marker = tmp_path / "RAN"
    run = _run_dir(tmp_path, marker)
    from vagent.runs.manifest import write_manifest

    ckpt = run / "checkpoints" / "step_000001"
    (ckpt / "policy").mkdir(parents=True)
    (ckpt / "policy" / "config.json").write_text("{}")
    (ckpt / "state.pt").write_bytes(b"")
    write_manifest(ckpt)  # a checkpoint whose policy/ matches its manifest: eval goes on to the run's config
    env = {"PYTHONPATH": str(tmp_path / "mods"), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-m", "vagent", "eval", str(run)], capture_output=True, text=True, env=env,
                         timeout=120)
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode != 0 and not marker.exists(), (out.stdout, out.stderr)
    assert len(lines) == 1 and f"vagent eval {run} --import planted" in lines[0], lines
