"""scripts/cpu_numerics_probe.py: the per-op fingerprint is the same in every process on one CPU
(else a difference between two CPUs would say nothing), and its comparison names the op that differs."""

from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "cpu_numerics_probe.py"


def _probe_module():
    spec = importlib.util.spec_from_file_location("cpu_numerics_probe", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_probe_digests_repeat_a_changed_op_is_named_and_the_recorded_fingerprints_are_complete():
    probe = _probe_module()
    first, second = probe.probes(), probe.probes()
    assert first == second and len(first) >= 20
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
