"""``vagent sweep`` whose every trial fails exits 1 and says each failed trial in one line: its
error and the ``error.txt`` where Ray Tune keeps the traceback, which stays off the console (as does Tune's closing list of
the failed trials). Here
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
    assert "Trials did not complete" not in console, console  # Tune's list of the same failures
    for line in lines:
        assert f"model directory '{tmp_path / 'no-model'}' does not exist" in line, line
        error_txt = Path(line.split("(traceback: ")[1].split(")")[0])
        assert out in error_txt.parents and 'File "' in error_txt.read_text()  # the frames are kept there


def test_tunes_own_lists_of_failed_trials_stay_off_the_console(caplog):
    """The records the sweep's filter drops, on the loggers Tune writes them to; anything else passes."""
    import logging

    from vagent.sweep.runner import TUNE_TRIAL_LOGGERS, _quiet_trial_tracebacks

    _quiet_trial_tracebacks()
    with caplog.at_level(logging.INFO):
        logging.getLogger("ray.tune.tune").error("Trials did not complete: %s", ["tune_trial_a", "tune_trial_b"])
        logging.getLogger("ray.tune.execution.tune_controller").error("Trial task failed for trial %s", "tune_trial_a")
        logging.getLogger("ray.tune.tune").info("Total run time: 3.00 seconds")
    assert [r.getMessage() for r in caplog.records] == ["Total run time: 3.00 seconds"]
    assert set(TUNE_TRIAL_LOGGERS) == {"ray.tune.tune", "ray.tune.execution.tune_controller"}
