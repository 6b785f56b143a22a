"""What a run's numbers depend on besides its config: the thread count, the CPU kernels, the versions.

On a CPU, a float result depends on the order of its additions, and that order depends on:

- **the intra-op thread count**: MKL's GEMMs and ATen's parallel reductions split their work by
  thread, so ``threads: 1`` and ``threads: 2`` give different last bits, which training amplifies
  (measured: the tiny model's weights after 10 caption steps differ between 1 and 2 threads). The
  run config's ``threads`` fixes it (the default run sets 2); ``threads: 0`` takes torch's default,
  which is the machine's core count, so results then depend on the machine.
- **the CPU's instruction set**: MKL, ATen and oneDNN pick AVX-512 kernels on CPUs that have them
  and AVX2 kernels on the others, with different rounding. :func:`vagent.numerics.pin_cpu_kernels`
  asks all three for their AVX2 code paths on every x86 CPU that has AVX2 (``MKL_CBWR=AVX2``, MKL's
  conditional numerical reproducibility; ``ATEN_CPU_CAPABILITY=avx2``; ``ONEDNN_MAX_CPU_ISA=AVX2``
  for the convolutions), unless the user set these variables. It has to run
  before torch is imported; the ``vagent`` command does it first thing. MKL honours
  ``MKL_CBWR=AVX2`` on Intel CPUs only (on others it runs its ``AUTO`` branch), and no setting
  found so far makes an AMD and an Intel CPU agree bit for bit (docs/results.md, 'Results on other
  CPUs'): the pins make results repeat on one CPU model, not across vendors.
- **the CPU**: its vendor, model and kernel flags (AVX2, AVX-512, AMX) are recorded as
  ``cpu_vendor``, ``cpu_model`` and ``cpu_flags``; a resume on another CPU warns like the rest.
- **library versions**: kernels and model code change between releases; ``constraints.txt`` pins
  the versions the README's figures were measured with.

The run directory's ``environment.json`` records all of it; ``--resume`` compares the resuming
process against it and warns about each difference (the resumed run is then exact only up to them).
Neither the load on the machine nor OMP_NUM_THREADS (when ``threads`` is set) changes a result.
"""

from __future__ import annotations

import json
import os
import platform
import sys
from importlib import metadata
from pathlib import Path

from vagent.numerics import PINNED_CPU_KERNELS

#: the distributions whose versions a run records
RECORDED_PACKAGES = ("torch", "transformers", "tokenizers", "safetensors", "numpy", "pillow", "peft",
                     "accelerate", "huggingface-hub", "gymnasium", "cairosvg", "vagent")

#: fields of environment.json that change results when they differ (the rest is informational)
RESULT_FIELDS = ("threads", "cpu_capability", "cpu_kernel_env", "packages", "machine")

#: the CPU: its vendor decides MKL's code path (``MKL_CBWR=AVX2`` holds on Intel CPUs only; on
#: others MKL runs its ``AUTO`` branch), so the same run gives other last bits on another CPU
#: (docs/results.md, 'Results on other CPUs'); a resume on another CPU warns as for the fields above
CPU_FIELDS = ("cpu_vendor", "cpu_model", "cpu_flags")

#: the /proc/cpuinfo flags that select kernels (AVX2, FMA, AVX-512 and its extensions, AMX)
KERNEL_CPU_FLAGS = ("avx2", "fma", "avx512f", "avx512dq", "avx512bw", "avx512vl", "avx512_vnni",
                    "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8")


def _cpuinfo(field: str) -> str | None:
    """The first ``field : value`` of /proc/cpuinfo (None where there is none, e.g. not Linux)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.split(":", 1)[0].strip() == field:
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def _cpu_model() -> str:
    return _cpuinfo("model name") or platform.processor() or "unknown"


def _cpu_vendor() -> str:
    """``GenuineIntel``, ``AuthenticAMD``, ... (x86), else the machine (``aarch64``)."""
    return _cpuinfo("vendor_id") or platform.machine() or "unknown"


def _cpu_flags() -> list[str]:
    flags = set((_cpuinfo("flags") or "").split())
    return [f for f in KERNEL_CPU_FLAGS if f in flags]


def describe_environment() -> dict:
    """What this process's results depend on (call after the run set its thread count)."""
    import torch

    packages = {}
    for name in RECORDED_PACKAGES:
        try:
            packages[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            packages[name] = None
    return {
        "threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_kernel_env": {k: os.environ.get(k) for k in PINNED_CPU_KERNELS},
        "packages": packages,
        "machine": platform.machine(),
        "cpu_vendor": _cpu_vendor(),
        "cpu_model": _cpu_model(),
        "cpu_flags": _cpu_flags(),
        "cpu_count": os.cpu_count(),
        "python": sys.version.split()[0],
        "omp_num_threads_env": os.environ.get("OMP_NUM_THREADS"),
        # speed only: the OpenMP wait settings (the vagent command picks them for the machine's load: vagent/omp.py)
        "omp_wait_env": {k: os.environ.get(k) for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "VAGENT_OMP_WAIT")},
        # the job: its processes and hosts (1 and 1 for a plain `vagent train`)
        "ranks": int(os.environ.get("WORLD_SIZE", "1")),
        "nodes": int(os.environ.get("GROUP_WORLD_SIZE", "1")),
    }


def environment_differences(saved: dict, now: dict, fields: tuple[str, ...] = RESULT_FIELDS + CPU_FIELDS) -> list[str]:
    """The result-changing ``fields`` that differ between a recorded environment and this one (a
    CPU field that ``saved`` lacks, written before vagent recorded it, is not compared)."""
    out = []
    for key in fields:
        if key in CPU_FIELDS and key not in saved:
            continue
        a, b = saved.get(key), now.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += [f"{key}.{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in sorted(set(a) | set(b))
                    if a.get(k) != b.get(k)]
        elif a != b:
            out.append(f"{key}: {a!r} -> {b!r}")
    return out


def record_environment(root: Path, say=print) -> dict:
    """Write ``root/environment.json`` (a new run), or compare against it (a resumed run) and warn
    about each difference that can change results. Returns this process's environment."""
    now = describe_environment()
    path = Path(root) / "environment.json"
    if path.is_file():
        diffs = environment_differences(json.loads(path.read_text()), now)
        if diffs:
            say("warning: this process differs from the one that started the run in what its results "
                "depend on, so the resumed run is not bit-exact: " + "; ".join(diffs)
                + " (docs/training.md, 'Reproducibility')")
    else:
        path.write_text(json.dumps(now, indent=2) + "\n")
    return now
