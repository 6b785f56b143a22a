"""bench/command_cpu.py's accounting arithmetic: a command's tree by parent pid, the processes
reparented to init while it ran (Ray's daemons after their driver ended), and the parts of the
command: the steps of its shell, each with its process tree."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def cc():
    sys.path.insert(0, str(ROOT / "bench"))
    spec = importlib.util.spec_from_file_location("command_cpu", ROOT / "bench" / "command_cpu.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["command_cpu"] = module  # the dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


def test_the_tree_counts_reparented_processes_of_its_window_only(cc):
    P = cc.Proc
    procs = [
        P("bash", 0.1, 100, 500, 10, 1),          # the command (started by a shell that is not recorded)
        P("pip", 40.0, 101, 60, 11, 10),
        P("python", 300.0, 170, 300, 12, 10),     # pytest
        P("python", 8.0, 180, 40, 13, 12),        # a vagent train run the test waited for
        P("pip", 3.0, 190, 5, 19, 12),            # a test's pip: inside pytest, not a part
        P("gcs_server", 2.0, 200, 30, 14, 1),     # Ray's, reparented when its driver ended
        P("ray::EngineRepl", 6.0, 201, 29, 15, 14),
        P("python", 50.0, 50, 20, 16, 1),         # another user's process, before the command
        P("python", 70.0, 700, 20, 17, 1),        # and one after it
        P("python", 9.0, 300, 5, 18, 99),         # a child of an unrelated, unrecorded parent
    ]
    tree, reparented = cc.command_tree(procs, 10)
    assert sorted(p.pid for p in tree) == [10, 11, 12, 13, 19]
    assert sorted(p.pid for p in reparented) == [14, 15]
    assert [(label, sorted(p.pid for p in procs)) for label, procs in cc.parts(tree, 10)] == \
        [("install 1", [11]), ("pytest 1", [12, 13, 19])]
    with pytest.raises(SystemExit, match="no accounting record of pid 42"):
        cc.command_tree(procs, 42)


def test_report_prints_the_total_by_name_and_by_part(cc, capsys):
    P = cc.Proc
    procs = [P("time", 0.0, 100, 900, 9, 1), P("bash", 0.5, 100, 900, 10, 9),  # `time` runs the command's shell
             P("python3", 0.2, 100, 1, 16, 10), P("pip", 30.0, 101, 50, 11, 10), P("pip", 10.0, 140, 20, 12, 10),
             # the pytest session, its main thread renamed by gRPC; a test's long run and its pip inside it
             P("default-executo", 600.0, 200, 600, 13, 10), P("python", 40.0, 300, 100, 17, 13),
             P("pip", 2.0, 400, 10, 18, 13), P("raylet", 5.0, 300, 100, 20, 1),
             P("bash", 0.0, 810, 40, 14, 10), P("pip", 20.0, 811, 38, 19, 14),  # scripts/vllm-env
             P("python", 100.0, 850, 120, 15, 10)]
    cc.report(procs, 9, top=10)
    out = capsys.readouterr().out
    assert out.startswith("808 s of CPU (13.5 min) in 12 processes") and "5 s in processes reparented" in out
    assert "   600.0      1  default-executo" in out and "    62.0      4  pip" in out
    # the venv and two pips in a row are one install; the raylet (started at 300) belongs to pytest 1, and so do
    # the test's own run and pip; the script that builds a venv is an install
    assert "    40.2 s  install 1" in out and "   647.0 s  pytest 1" in out
    assert "    20.0 s  install 2" in out and "   100.0 s  pytest 2" in out
    assert "     0.5 s  outside the steps" in out
