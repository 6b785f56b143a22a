"""The OpenMP wait settings (vagent/omp.py, bench/busy_cpu.py): PASSIVE on a busy machine, a bounded
spin on an idle one, never over the user's own settings; set by the vagent command and given to the
processes vagent starts, never by ``import vagent`` (issue 55, item 7)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from vagent.omp import child_wait_env, machine_load, omp_wait_settings, wait_mode

KEYS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "VAGENT_OMP_WAIT")
#: the environment of a user who set none of them
PLAIN = {k: v for k, v in os.environ.items() if k not in KEYS}

#: ``vagent ARGS`` in this process (the command's main, as ``python -m vagent`` runs it); prints the wait
#: settings this process had when torch started to load, and after
COMMAND = r"""
import json, os, sys
KEYS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "VAGENT_OMP_WAIT")
seen = {}
class TorchWatch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" and not seen:
            seen.update({k: os.environ.get(k) for k in KEYS})
sys.meta_path.insert(0, TorchWatch())
from vagent.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
import torch
print(json.dumps([seen, {k: os.environ.get(k) for k in KEYS}]))
"""


def vagent_command(env: dict[str, str], *args: str) -> tuple[dict, dict]:
    """(the wait settings as torch started to load, after) in ``vagent ARGS`` run with ``env``."""
    out = subprocess.run([sys.executable, "-c", COMMAND, *(args or ("--version",))], env=env, capture_output=True,
                         text=True, check=True, timeout=120).stdout
    seen, after = json.loads(out.splitlines()[-1])
    return seen, after


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
    # marked, but changed by the user after vagent set it: the user's
    assert omp_wait_settings(dict(parent, GOMP_SPINCOUNT="0"), load=9.0, cores=2) == {}
    assert omp_wait_settings(dict(parent, OMP_WAIT_POLICY="ACTIVE"), load=0.0, cores=2) == {}
    # what a process vagent starts gets: the user's own as they are, else a fresh choice, marked
    assert child_wait_env({"OMP_WAIT_POLICY": "ACTIVE", "PATH": "/bin"}) == {"OMP_WAIT_POLICY": "ACTIVE"}
    assert child_wait_env({"VAGENT_OMP_WAIT": "keep"}) == {"VAGENT_OMP_WAIT": "keep"}
    assert child_wait_env(parent) in ({"OMP_WAIT_POLICY": "PASSIVE", "VAGENT_OMP_WAIT": "auto"},
                                      {"GOMP_SPINCOUNT": "100000", "VAGENT_OMP_WAIT": "auto"})


@pytest.mark.parametrize("value", ["KEEP", "off", "0", "", "Auto", "passive"])
def test_an_unknown_vagent_omp_wait_is_refused_by_the_vagent_command(value):
    with pytest.raises(ValueError, match="'keep'.*'auto'"):
        wait_mode({"VAGENT_OMP_WAIT": value})
    with pytest.raises(ValueError):
        child_wait_env({"VAGENT_OMP_WAIT": value})
    done = subprocess.run([sys.executable, "-m", "vagent", "--version"], env=dict(PLAIN, VAGENT_OMP_WAIT=value),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"error: VAGENT_OMP_WAIT={value!r} ") and "unset" in line and "'keep'" in line \
        and "'auto'" in line, line


def test_import_vagent_changes_no_environment():
    code = ("import json, os, sys; before = dict(os.environ); import vagent, vagent.omp, vagent.cli; "
            "print(json.dumps([dict(os.environ) == before, 'torch' in sys.modules]))")
    for env in (PLAIN, dict(PLAIN, OMP_WAIT_POLICY="ACTIVE"), dict(PLAIN, GOMP_SPINCOUNT="100000", VAGENT_OMP_WAIT="auto"),
                dict(PLAIN, VAGENT_OMP_WAIT="keep")):
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True,
                             timeout=120).stdout
        assert json.loads(out) == [True, False], env


def test_the_vagent_command_sets_them_before_torch_loads_and_keeps_the_users():
    seen, after = vagent_command(PLAIN)
    assert seen == after and seen in ({"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": None, "VAGENT_OMP_WAIT": "auto"},
                                      {"OMP_WAIT_POLICY": None, "GOMP_SPINCOUNT": "100000", "VAGENT_OMP_WAIT": "auto"})
    seen, _ = vagent_command(dict(PLAIN, OMP_WAIT_POLICY="ACTIVE"))
    assert seen == {"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": None, "VAGENT_OMP_WAIT": None}
    seen, _ = vagent_command(dict(PLAIN, VAGENT_OMP_WAIT="keep"))
    assert seen == {"OMP_WAIT_POLICY": None, "GOMP_SPINCOUNT": None, "VAGENT_OMP_WAIT": "keep"}


def test_a_setting_the_user_makes_after_import_vagent_reaches_the_vagent_command_it_starts():
    """A program imports vagent, sets its own policy, then starts vagent (torchrun's ranks run the
    vagent command the same way): the command keeps the user's."""
    program = ("import os, subprocess, sys; import vagent; os.environ['OMP_WAIT_POLICY'] = 'ACTIVE'; "
               f"sys.exit(subprocess.run([sys.executable, '-c', {COMMAND!r}, '--version']).returncode)")
    out = subprocess.run([sys.executable, "-c", program], env=PLAIN, capture_output=True, text=True, check=True,
                         timeout=120).stdout
    seen, after = json.loads(out.splitlines()[-1])
    assert seen == after == {"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": None, "VAGENT_OMP_WAIT": None}


def test_busy_processes_that_just_started_make_vagent_sleep():
    """The 1-minute load average has not risen yet; the runnable count has."""
    idle_now = machine_load()
    cores = os.cpu_count() or 1
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(cores)]
    try:
        import time

        time.sleep(0.5)  # they are running
        assert machine_load() >= min(cores, idle_now + cores) - 0.5
        passive = {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": None, "VAGENT_OMP_WAIT": "auto"}
        assert vagent_command(PLAIN)[0] == passive
        # a child of a vagent process that chose the bounded spin on an idle machine decides again
        assert vagent_command(dict(PLAIN, GOMP_SPINCOUNT="100000", VAGENT_OMP_WAIT="auto"))[0] == passive
    finally:
        for b in burners:
            b.kill()
            b.wait()


#: a local Ray cluster started by a vagent command that chose the bounded spin; two probe actors
#: started as vagent starts its replicas (vagent.models.remote._replica_options)
RAY_PROBE = r"""
import json, os
import vagent.omp
from vagent.models.remote import _replica_options, start_ray
KEYS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "VAGENT_OMP_WAIT")
os.environ.update(GOMP_SPINCOUNT="100000", VAGENT_OMP_WAIT="auto")  # the vagent command's choice, idle machine
ray = start_ray(num_cpus=1)
class Probe:
    def env(self):
        return {k: os.environ.get(k) for k in KEYS}
probe = ray.remote(Probe)
vagent.omp.machine_load = lambda *a, **k: 9.0  # the machine is busy when the replica starts
busy = probe.options(num_cpus=0, **_replica_options(1, None)[0]).remote()
got = [ray.get(busy.env.remote())]
for k in KEYS:  # a program of the user's, which sets its own policy after the cluster started
    os.environ.pop(k, None)
os.environ["OMP_WAIT_POLICY"] = "ACTIVE"
users = probe.options(num_cpus=0, **_replica_options(1, None)[0]).remote()
got.append(ray.get(users.env.remote()))
ray.shutdown()
print(json.dumps(got))
"""


def test_ray_replicas_decide_again_and_keep_a_setting_the_user_made_later():
    pytest.importorskip("ray", reason="replicas need the ray extra: pip install 'vagent[ray]'")
    out = subprocess.run([sys.executable, "-c", RAY_PROBE], env=PLAIN, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    busy, users = json.loads(out.stdout.splitlines()[-1])
    # not the cluster's inherited GOMP_SPINCOUNT beside the new choice: that spin would override PASSIVE
    assert busy == {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": None, "VAGENT_OMP_WAIT": "auto"}
    assert users == {"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": None, "VAGENT_OMP_WAIT": None}


def test_a_load_average_left_by_ended_processes_is_an_idle_machine(tmp_path):
    """The 1-minute average still counts a process for a minute after it ended; only the
    processes runnable now (besides this one) make the machine busy."""
    stale = tmp_path / "loadavg"
    stale.write_text("1.17 1.26 1.49 1/79 9827\n")  # read right after a run ended: nothing else runnable
    assert machine_load(loadavg=str(stale)) == 0.0
    assert omp_wait_settings({}, machine_load(loadavg=str(stale)), cores=2) == {"GOMP_SPINCOUNT": "100000"}
    busy = tmp_path / "busy"
    busy.write_text("0.10 0.30 0.40 3/79 9827\n")  # two busy processes that started a moment ago
    assert machine_load(loadavg=str(busy), gap_s=0.0) == 2.0
    assert machine_load(loadavg=str(tmp_path / "absent")) == 0.0  # not Linux: the idle choice


def test_the_run_records_the_wait_settings_it_ran_with():
    """environment.json names them: they decide a run's speed on a small CPU (not its results). The
    suite's own process took them as the vagent command does (tests/conftest.py)."""
    from vagent.runs.environment import RESULT_FIELDS, describe_environment

    recorded = describe_environment()["omp_wait_env"]
    assert recorded == {k: os.environ.get(k) for k in KEYS}
    assert recorded["OMP_WAIT_POLICY"] or recorded["GOMP_SPINCOUNT"] or recorded["VAGENT_OMP_WAIT"] == "keep"
    assert "omp_wait_env" not in RESULT_FIELDS
