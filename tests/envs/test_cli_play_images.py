"""``vagent play`` shows a vision env to a human (PNG files whose paths stand where ``<image>`` is)
and documents ``--policy``; real subprocesses."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from PIL import Image


def run_cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vagent.envs.cli", *args], input=stdin, capture_output=True,
                          text=True, timeout=180)


def test_human_player_of_a_vision_env_gets_each_turns_image_as_a_file(tmp_path):
    lake = "fixed_map=[P_O_, _O__, ____, O__G]"
    out = run_cli("play", "frozenlake", "--config", lake, "image_size=80", "--image-dir", str(tmp_path / "img"),
                  stdin="down\ndown\n\n")
    assert out.returncode == 0, out.stderr
    shown = re.findall(r"\[<image> 1 of 1: (\S+)\]", out.stdout)
    assert [Path(p).name for p in shown] == ["turn_000_0.png", "turn_001_0.png", "turn_002_0.png"]
    first, second = (Image.open(p) for p in shown[:2])
    assert first.size == second.size == (80, 80) and first.tobytes() != second.tobytes()  # the agent moved


def test_human_player_without_image_dir_gets_a_temporary_folder(tmp_path):
    out = run_cli("play", "frozenlake", "--max-turns", "1", stdin="\n")
    assert out.returncode == 0, out.stderr
    (path,) = re.findall(r"\[<image> 1 of 1: (\S+)\]", out.stdout)
    assert Path(path).is_file() and "vagent-play-frozenlake-" in path
    Path(path).unlink()
    Path(path).parent.rmdir()
    # a text render shows no image and writes none
    out = run_cli("play", "frozenlake", "--render", "text", "--max-turns", "1", stdin="\n")
    assert out.returncode == 0 and "[<image>" not in out.stdout


def test_policy_has_help():
    out = run_cli("play", "--help")
    assert out.returncode == 0
    assert re.search(r"--policy \{human,random,solver\}\s+who replies: human", out.stdout), out.stdout
