"""``import vagent`` picks the OpenMP wait settings (vagent/__init__.py, bench/busy_cpu.py): PASSIVE on
a busy machine, a bounded spin on an idle one, and never over the user's own settings."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from vagent import omp_wait_settings


def test_busy_machine_sleeps_idle_machine_spins_briefly():
    assert omp_wait_settings({}, load=1.0, cores=2) == {"OMP_WAIT_POLICY": "PASSIVE"}
    assert omp_wait_settings({}, load=7.5, cores=2) == {"OMP_WAIT_POLICY": "PASSIVE"}
    assert omp_wait_settings({}, load=0.2, cores=2) == {"GOMP_SPINCOUNT": "100000"}
    assert omp_wait_settings({}, load=3.0, cores=16) == {"GOMP_SPINCOUNT": "100000"}


def test_the_users_settings_win_and_vagents_own_are_decided_again():
    assert omp_wait_settings({"OMP_WAIT_POLICY": "ACTIVE"}, load=9.0, cores=2) == {}
    # a parent vagent's choice (marked auto) is made again for the machine as it is now
    parent = {"GOMP_SPINCOUNT": "100000", "VAGENT_OMP_WAIT": "auto"}
    assert omp_wait_settings(parent, load=9.0, cores=2) == {"OMP_WAIT_POLICY": "PASSIVE"}
    assert omp_wait_settings({"GOMP_SPINCOUNT": "0"}, load=9.0, cores=2) == {}
    assert omp_wait_settings({"VAGENT_OMP_WAIT": "keep"}, load=9.0, cores=2) == {}


def test_import_vagent_sets_one_of_them_before_torch_loads():
    code = ("import json, os, sys; import vagent; "
            "print(json.dumps([os.environ.get('OMP_WAIT_POLICY'), os.environ.get('GOMP_SPINCOUNT'), "
            "'torch' in sys.modules]))")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "VAGENT_OMP_WAIT")}
    policy, spin, torch_loaded = json.loads(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                                                           text=True, check=True).stdout)
    assert (policy, spin) in (("PASSIVE", None), (None, "100000")) and not torch_loaded
    kept = json.loads(subprocess.run([sys.executable, "-c", code], env=dict(env, OMP_WAIT_POLICY="ACTIVE"),
                                     capture_output=True, text=True, check=True).stdout)
    assert kept[:2] == ["ACTIVE", None]


def test_busy_processes_that_just_started_make_vagent_sleep():
    """The 1-minute load average has not risen yet; the runnable count has."""
    from vagent import machine_load

    idle_now = machine_load()
    cores = os.cpu_count() or 1
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(cores)]
    try:
        import time

        time.sleep(0.5)  # they are running
        assert machine_load() >= min(cores, idle_now + cores) - 0.5
        code = ("import os, vagent; print(os.environ.get('OMP_WAIT_POLICY'), os.environ.get('GOMP_SPINCOUNT'), "
                "os.environ.get('VAGENT_OMP_WAIT'))")
        env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "VAGENT_OMP_WAIT")}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
        assert out.split() == ["PASSIVE", "None", "auto"]
        # a child of a vagent process that chose the bounded spin on an idle machine decides again
        inherited = dict(env, GOMP_SPINCOUNT="100000", VAGENT_OMP_WAIT="auto")
        out = subprocess.run([sys.executable, "-c", code], env=inherited, capture_output=True, text=True,
                             check=True).stdout
        assert out.split() == ["PASSIVE", "None", "auto"]
    finally:
        for b in burners:
            b.kill()
            b.wait()


def test_a_load_average_left_by_ended_processes_is_an_idle_machine(tmp_path):
    """The 1-minute average still counts a process for a minute after it ended; only the
    processes runnable now (besides this one) make the machine busy."""
    from vagent import machine_load

    stale = tmp_path / "loadavg"
    stale.write_text("1.17 1.26 1.49 1/79 9827\n")  # read right after a run ended: nothing else runnable
    assert machine_load(loadavg=str(stale)) == 0.0
    assert omp_wait_settings({}, machine_load(loadavg=str(stale)), cores=2) == {"GOMP_SPINCOUNT": "100000"}
    busy = tmp_path / "busy"
    busy.write_text("0.10 0.30 0.40 3/79 9827\n")  # two busy processes that started a moment ago
    assert machine_load(loadavg=str(busy), gap_s=0.0) == 2.0
    assert machine_load(loadavg=str(tmp_path / "absent")) == 0.0  # not Linux: the idle choice


def test_the_run_records_the_wait_settings_it_ran_with():
    """environment.json names them: they decide a run's speed on a small CPU (not its results)."""
    from vagent.runs.environment import RESULT_FIELDS, describe_environment

    recorded = describe_environment()["omp_wait_env"]
    assert recorded == {k: os.environ.get(k) for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "VAGENT_OMP_WAIT")}
    assert recorded["OMP_WAIT_POLICY"] or recorded["GOMP_SPINCOUNT"] or recorded["VAGENT_OMP_WAIT"] == "keep"
    assert "omp_wait_env" not in RESULT_FIELDS
