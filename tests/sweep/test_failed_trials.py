"""``vagent sweep`` whose every trial fails exits 1 and says each failed trial in one line: its
error and the ``error.txt`` where Ray Tune keeps the traceback, which stays off the console. Here
each trial's model directory does not exist (the sweep file is valid; the trials fail as they load
the model)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import run_sweep_process, write_sweep

pytest.importorskip("ray.tune", reason="vagent sweep needs Ray Tune: pip install 'vagent[ray]'")


@pytest.mark.timeout(1200)
def test_a_sweep_whose_trials_all_fail_exits_1_with_one_line_each(tmp_path: Path):
    sweep_file = write_sweep(tmp_path / "s.yaml", tmp_path / "no-model", seeds=[0, 1])
    out = tmp_path / "sweep"
    done = run_sweep_process(sweep_file, out)
    console = done.stdout + done.stderr
    assert done.returncode == 1, console
    lines = [line for line in done.stderr.splitlines() if line.startswith("error: trial ")]
    assert sorted(line.split()[2] for line in lines) == ["base/seed_0", "base/seed_1"], console
    assert "Traceback" not in console and 'File "' not in console, console
    for line in lines:
        assert f"model directory '{tmp_path / 'no-model'}' does not exist" in line, line
        error_txt = Path(line.split("(traceback: ")[1].split(")")[0])
        assert out in error_txt.parents and 'File "' in error_txt.read_text()  # the frames are kept there
