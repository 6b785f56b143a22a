"""Remote envs as a user meets them (issue 34, findings 2 and 3): a real ``vagent serve-env`` with a
token, started from the folder that holds ``mypackage/`` (the corridor template of
docs/custom_env.md), serving an env that this test process never imports.

- ``serve-env --import mypackage.corridor`` finds the module from the current folder (the console
  script's ``sys.path`` has no current folder: the server runs as ``python -P -m vagent``);
- ``vagent train`` without the token, with a wrong one, on a dead URL or on an env the server does
  not serve is refused in one line before the model is built; with the token (``envs.0.token`` or
  ``VAGENT_SERVICE_TOKEN``) the server-only env trains and validates;
- ``check_env`` passes on a ``RemoteEnv`` of the server-only env (fresh-process check included).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.recipes.conftest import small_overrides
from tests.recipes.test_custom_env import guide_module
from tests.service.conftest import free_port, wait_healthy

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "remote-envs-token-0123"
#: the model path of the refusal tests: nothing exists there, so a refusal that came after the
#: model build would name the model instead of the server
NO_MODEL = "/nonexistent/model-dir"


@pytest.fixture(scope="module")
def corridor_server(tmp_path_factory):
    """``vagent serve-env --import mypackage.corridor --envs corridor --token T`` run from the folder
    that holds mypackage/ (and nowhere else on sys.path)."""
    folder = tmp_path_factory.mktemp("simhost")
    (folder / "mypackage").mkdir()
    (folder / "mypackage" / "__init__.py").write_text("")
    (folder / "mypackage" / "corridor.py").write_text(guide_module())
    port = free_port()
    log = open(folder / "server.log", "wb")
    env = {k: v for k, v in os.environ.items() if k not in ("VAGENT_SERVICE_TOKEN", "PYTHONPATH")}
    proc = subprocess.Popen([sys.executable, "-P", "-m", "vagent", "serve-env", "--import", "mypackage.corridor",
                             "--envs", "corridor", "--port", str(port), "--token", TOKEN],
                            cwd=folder, stdout=log, stderr=subprocess.STDOUT, env={**env, "PYTHONPATH": str(ROOT)})
    url = f"http://127.0.0.1:{port}"
    wait_healthy(proc, url, 60, (folder / "server.log").read_text)
    yield url
    proc.terminate()
    proc.wait(timeout=10)
    log.close()


@pytest.fixture(autouse=True)
def no_token_in_env(monkeypatch):
    monkeypatch.delenv("VAGENT_SERVICE_TOKEN", raising=False)


def test_the_env_lives_only_on_the_server(corridor_server):
    from vagent.envs import list_envs

    assert "corridor" not in list_envs() and "mypackage" not in sys.modules


def test_serve_env_import_errors_are_one_line(tmp_path):
    out = subprocess.run([sys.executable, "-P", "-m", "vagent", "serve-env", "--import", "mypackage.corridor",
                          "--port", str(free_port())], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert "--import: import 'mypackage.corridor': no module named 'mypackage'" in out.stderr
    assert f"searched the current directory {tmp_path}" in out.stderr


def _train_args(tmp_path: Path, url: str, *extra: str, model: str = NO_MODEL) -> list[str]:
    return ["train", "--quiet", *small_overrides(tmp_path, Path(model), "envs.0.name=corridor", "envs.0.config={}",
                                                  f"envs.0.urls=[{url}]", *extra)]


@pytest.mark.parametrize("extra, said", [
    ((), "the server requires a token and none was sent: set it in envs.N.token or the environment variable "
         "VAGENT_SERVICE_TOKEN."),
    (("envs.0.token=not-the-token",), "the token was refused"),
])
def test_train_without_the_token_is_refused_before_the_model_build(corridor_server, tmp_path, capsys, extra, said):
    from vagent.cli import main

    assert main(_train_args(tmp_path, corridor_server, *extra)) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: envs.0 (corridor) at {corridor_server}: ") and said in err, err
    assert err.count("\n") == 1 and not (tmp_path / "runs").exists()


def test_dead_server_and_unserved_env_are_refused(corridor_server, tmp_path, capsys):
    from vagent.cli import main

    dead = f"http://127.0.0.1:{free_port()}"
    args = _train_args(tmp_path, corridor_server,
                       f"envs=[{{name: corridor, urls: [{corridor_server}], token: {TOKEN}}}, "
                       f"{{name: frozenlake, urls: [{dead}, {corridor_server}], token: {TOKEN}}}]")
    assert main(args) == 1
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "error: 2 env servers failed their check:"
    assert lines[1].startswith(f"  envs.1 (frozenlake) at {dead}: unreachable")
    assert lines[2].startswith(f"  envs.1 (frozenlake) at {corridor_server}: the server does not serve 'frozenlake'")
    assert len(lines) == 3


def test_token_in_the_config_passes_the_check(corridor_server, tmp_path, capsys):
    """With envs.0.token the servers pass, so the next thing to fail is the (missing) model."""
    from vagent.cli import main

    assert main(_train_args(tmp_path, corridor_server, f"envs.0.token={TOKEN}")) == 1
    assert capsys.readouterr().err.startswith(f"error: model.path: model directory '{NO_MODEL}' does not exist")


def test_server_only_env_trains_and_validates(corridor_server, tmp_path, tiny_vlm, monkeypatch, capsys):
    """The token from VAGENT_SERVICE_TOKEN; the env's stop strings, format and actions from the server."""
    from vagent.cli import main

    monkeypatch.setenv("VAGENT_SERVICE_TOKEN", TOKEN)
    args = _train_args(tmp_path, corridor_server, "val.every=2", model=str(tiny_vlm))
    assert main(args) == 0, capsys.readouterr().err
    run = next((tmp_path / "runs").iterdir())
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss/policy" in r] == [1, 2]
    assert [r["step"] for r in records if "val/corridor/success_rate" in r] == [0, 2]
    log = (run / "train.log").read_text()
    assert f"envs.0 (corridor) at {corridor_server}: ok (token sent): Corridor: walk right along a corridor" in log


def test_check_env_on_a_server_only_remote_env(corridor_server):
    from vagent.envs import check_env
    from vagent.service import RemoteEnv

    report = check_env(lambda: RemoteEnv(corridor_server, "corridor", token=TOKEN, length=5), n_steps=3)
    assert "determinism in a fresh process" in report.checks and not report.warnings


def test_env_info_route_describes_the_server_only_env(corridor_server):
    from vagent.service.preflight import check_server

    c = check_server(corridor_server, "corridor", TOKEN, "here")
    assert c.ok and c.info is not None
    assert c.info.action_names == ["Left", "Right"] and c.info.reply_stop == []
    assert "length" in [f.name for f in c.info.config_fields]


def test_sft_demos_of_a_server_only_env_are_refused_before_the_model_build(corridor_server, tmp_path, capsys):
    """Solver demonstrations are played in the training process, where the env does not exist."""
    from vagent.cli import main

    assert main(_train_args(tmp_path, corridor_server, f"envs.0.token={TOKEN}", "sft.steps=2")) == 1
    err = capsys.readouterr().err
    assert "sft.steps 2 plays solver demonstrations of corridor in this process" in err and "pass --import" in err
