"""What the benchmark scripts share: the median wall time of repeated calls, the machine's CPU name
and the arguments of the scripts that measure a saved policy.

A script imports it as ``from common import median_ms`` (``python bench/x.py`` puts bench/ first on
``sys.path``; bench/ is not a package).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable


def median_s(fn: Callable[[], object], repeats: int) -> float:
    """Median wall seconds of ``repeats`` calls of ``fn()`` (``time.perf_counter`` around each call)."""
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}: pass --repeats 1 or more")
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def median_ms(fn: Callable[[], object], repeats: int) -> float:
    """:func:`median_s` in milliseconds."""
    return median_s(fn, repeats) * 1e3


def cpu_name() -> str:
    """The CPU's model name from /proc/cpuinfo ("unknown CPU" where there is none, e.g. macOS)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def policy_probe_parser(doc: str, n: int, dir_arg: str = "policy_dir") -> argparse.ArgumentParser:
    """The parser of a script that measures a saved policy (``doc``: the script's docstring, its
    first line the description): the policy's folder (positional ``dir_arg``), ``--n`` (how many
    boards or episodes, default ``n``) and ``--threads`` (torch CPU threads, default 2)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument(dir_arg)
    ap.add_argument("--n", type=int, default=n)
    ap.add_argument("--threads", type=int, default=2)
    return ap
