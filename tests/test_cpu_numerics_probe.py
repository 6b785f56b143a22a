"""scripts/cpu_numerics_probe.py: the per-op fingerprint is the same in every process on one CPU
(else a difference between two CPUs would say nothing; the ops it names in UNSTABLE are not, and the
comparison says so), and its comparison names the op that differs."""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "cpu_numerics_probe.py"


def _probe_module():
    spec = importlib.util.spec_from_file_location("cpu_numerics_probe", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _probes_in_a_new_process() -> dict[str, str]:
    """``probes()`` as the script runs it: first thing in a process of its own, with the thread
    variables of a ``vagent`` command (the suite's MKL_NUM_THREADS=1 and OMP_NUM_THREADS=1 removed:
    under MKL_NUM_THREADS=1, ATen's causal-attention backward digests differently on a process's
    first probe, at 2 threads after 1, than on a later one)."""
    code = "import json, cpu_numerics_probe; print(json.dumps(cpu_numerics_probe.probes()))"
    env = {k: v for k, v in os.environ.items() if k not in ("MKL_NUM_THREADS", "OMP_NUM_THREADS")}
    out = subprocess.run([sys.executable, "-c", code], cwd=SCRIPT.parent, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


def test_probe_digests_repeat_a_changed_op_is_named_and_the_recorded_fingerprints_are_complete():
    probe = _probe_module()
    first, second = _probes_in_a_new_process(), _probes_in_a_new_process()
    assert set(first) == set(second) and len(first) >= 20
    changed = sorted(k for k in first if first[k] != second[k])
    assert set(changed) <= probe.UNSTABLE, f"ops whose digest changed between two processes on this CPU: {changed}"
    assert {k.split("/")[0] for k in first} == {"mkl", "onednn", "aten"}
    a = {"probes": first}
    b = copy.deepcopy(a)
    b["probes"]["onednn/conv3d weight grad"] = "0" * 16
    assert probe.compare(a, b) == ["onednn/conv3d weight grad"]
    # the AMD fingerprints beside the script (one per candidate setting) name their CPU and every probe
    recorded = sorted((SCRIPT.parent / "cpu_numerics").glob("*/*.json"))
    assert recorded
    for path in recorded:
        fp = json.loads(path.read_text())
        assert fp["cpu"]["cpu_vendor"] and fp["cpu"]["cpu_model"], path
        assert set(fp["probes"]) == set(first), path
