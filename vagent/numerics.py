"""Pin the CPU kernels that MKL and ATen choose, before torch is imported (no torch import here).

MKL, ATen and oneDNN pick AVX-512 kernels on CPUs that have them and AVX2 kernels on the others, and
the two round differently, so the same run gives different numbers on two x86 machines. On every
x86 CPU with AVX2, :func:`pin_cpu_kernels` asks all three for their AVX2 code paths
(``MKL_CBWR=AVX2``: MKL's conditional numerical reproducibility; ``ATEN_CPU_CAPABILITY=avx2``;
``ONEDNN_MAX_CPU_ISA=AVX2``: oneDNN runs the convolutions, e.g. a vision encoder's patch embedding)
unless the user set these variables (set them yourself to opt out, e.g. ``ATEN_CPU_CAPABILITY=avx512``). The ``vagent``
command calls it first thing; see :mod:`vagent.runs.environment` for what else a result depends on.

Scope: the pins make a run repeat bit for bit on one CPU model (and across AVX2 and AVX-512 AMD
EPYCs, measured), not across vendors. MKL honours ``MKL_CBWR=AVX2`` on Intel CPUs only; on an AMD
CPU it runs its ``AUTO`` branch (``MKL_VERBOSE=1`` prints ``CNR:AUTO``). ``MKL_CBWR=COMPATIBLE``
is the one branch MKL runs on both, but with it the scaled default pipeline still differs between
an AMD EPYC and an Intel Xeon from the first SFT step's gradient (docs/results.md, 'Results on
other CPUs'), so it is not the default. ``scripts/cpu_numerics_probe.py`` fingerprints the kernels
op by op to compare two CPUs.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

#: environment variables that select CPU kernels, and the values vagent pins (x86 with AVX2 only)
PINNED_CPU_KERNELS = {"MKL_CBWR": "AVX2", "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}


def _cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def pin_cpu_kernels(environ: "os._Environ[str] | dict[str, str]" = os.environ) -> dict[str, str]:
    """Set :data:`PINNED_CPU_KERNELS` in ``environ`` on an x86 CPU with AVX2, leaving any variable
    the user already set; returns what it set. Call before ``import torch`` (MKL and ATen read the
    variables once, when they first run; oneDNN when it first runs)."""
    if platform.machine().lower() not in ("x86_64", "amd64") or "avx2" not in _cpu_flags():
        return {}
    done = {}
    for key, value in PINNED_CPU_KERNELS.items():
        if key not in environ:
            environ[key] = value
            done[key] = value
    return done


