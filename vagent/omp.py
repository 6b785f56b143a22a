"""The OpenMP wait settings of the processes vagent starts (bench/busy_cpu.py measures them).

libgomp's workers spin for a while when idle. On a machine whose cores other processes hold,
spinning workers steal the time the working thread needs: one forward + backward of the default
run's model beside 2 / 4 busy processes took 2.0-2.5x / 2.8-3.4x its fair share with libgomp's
default, 0.8-0.9x / 0.7-0.9x with ``OMP_WAIT_POLICY=PASSIVE``, but PASSIVE costs 1.3-1.4x on an
idle machine (tiny models run many small ops), where a bounded spin (``GOMP_SPINCOUNT=100000``)
costs 1.03x and still helps under load (1.3x / 2.1x of the fair share). So vagent takes PASSIVE
when the machine is busy as a process starts (:func:`machine_load`: other processes runnable on at
least half the cores), else the bounded spin (:func:`omp_wait_settings`). Results are unchanged
(scheduling only).

Where: ``import vagent`` changes nothing. The ``vagent`` command sets them in its own process
before torch loads (:func:`apply_wait_settings`, vagent/cli.py), and so does every torchrun rank
(each runs ``python -m vagent train``); a Ray replica actor gets them in its runtime env
(:func:`child_wait_env`, vagent/models/remote.py). A program of your own that wants them calls
:func:`apply_wait_settings` before it imports torch (tests/conftest.py does).

Whose settings: your own ``OMP_WAIT_POLICY`` / ``GOMP_SPINCOUNT``, set at any time before vagent
starts a process, win. ``VAGENT_OMP_WAIT`` takes three values, any other is refused
(:func:`wait_mode`):

- unset: vagent decides, unless you set one of the two;
- ``keep``: vagent sets nothing (libgomp's default, or your own settings);
- ``auto``: vagent's mark on a choice it made. A process vagent starts decides again for the
  machine as it is when it starts, instead of inheriting a choice made while the machine was idle:
  the scaled default run beside one busy process took 402 s with an inherited
  ``GOMP_SPINCOUNT=100000`` and 73 s with PASSIVE. Marked settings that are not one of vagent's
  choices (you changed them after vagent set them) are yours.
"""

from __future__ import annotations

import contextlib
import os
from typing import Iterator, Mapping, MutableMapping

#: the variables libgomp reads for its wait policy
WAIT_KEYS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
#: vagent's own variable (see the module docstring), and the values it takes besides unset
MODE_KEY = "VAGENT_OMP_WAIT"
MODES = ("auto", "keep")
#: vagent's choice on a busy machine, and on an idle one
BUSY, IDLE = {"OMP_WAIT_POLICY": "PASSIVE"}, {"GOMP_SPINCOUNT": "100000"}


def wait_mode(environ: Mapping[str, str]) -> str | None:
    """``VAGENT_OMP_WAIT`` of ``environ`` (None when unset); ValueError, one line, for any other
    value than :data:`MODES` (``KEEP``, ``off``, ``0`` and empty are not taken for ``auto``)."""
    value = environ.get(MODE_KEY)
    if value is not None and value not in MODES:
        raise ValueError(f"{MODE_KEY}={value!r} is not a value vagent takes: leave it unset (vagent picks the OpenMP "
                         "wait settings for the machine's load), 'keep' (vagent sets none: libgomp's default or your "
                         "own OMP_WAIT_POLICY / GOMP_SPINCOUNT) or 'auto' (vagent's mark on a choice it made)")
    return value


def vagents_own(environ: Mapping[str, str]) -> bool:
    """Whether the wait settings in ``environ`` are a choice vagent made (marked ``auto`` and as
    vagent sets them), so a process vagent starts decides again instead of keeping them."""
    present = {k: environ[k] for k in WAIT_KEYS if k in environ}
    return wait_mode(environ) == "auto" and present in ({}, BUSY, IDLE)


def omp_wait_settings(environ: Mapping[str, str], load: float, cores: int) -> dict[str, str]:
    """The wait settings vagent gives a process whose environment is ``environ``, on a machine
    with ``load`` other processes runnable (:func:`machine_load`) on ``cores`` cores: PASSIVE when
    they fill at least half the cores, else the bounded spin; ``{}`` (set nothing) under
    ``VAGENT_OMP_WAIT=keep`` or when the user set their own (a choice vagent made is decided again)."""
    if wait_mode(environ) == "keep":
        return {}
    if not vagents_own(environ) and any(k in environ for k in WAIT_KEYS):
        return {}
    return dict(BUSY) if load >= 0.5 * max(1, cores) else dict(IDLE)


def machine_load(looks: int = 3, gap_s: float = 0.01, loadavg: str = "/proc/loadavg") -> float:
    """How busy the machine is as vagent starts: the processes runnable right now besides this one
    (``/proc/loadavg``'s running count, the fewest of ``looks`` looks ``gap_s`` apart, so a process
    that runs for an instant is not counted). A busy process is runnable at every look, one that
    started a moment ago included.

    The 1-minute load average is not used: it still counts a process for about a minute after it
    ended, so every process started right after a heavy one (the next run of a script, a test's
    subprocess, a benchmark's second configuration) took the busy machine's PASSIVE on an idle
    machine, and PASSIVE costs 1.3-1.4x on an idle machine (up to 10x on a loop of small ops). Not
    Linux (no ``loadavg`` file): 0, the idle machine's choice."""
    import time

    now: list[int] = []
    for i in range(looks):
        try:
            with open(loadavg) as f:
                now.append(max(0, int(f.read().split()[3].split("/")[0]) - 1))
        except (OSError, IndexError, ValueError):
            break
        if min(now) == 0:  # more looks cannot raise the answer (an idle machine pays no wait)
            break
        if i + 1 < looks:
            time.sleep(gap_s)
    return float(min(now)) if now else 0.0


def child_wait_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The wait variables (:data:`WAIT_KEYS` and ``VAGENT_OMP_WAIT``) of a process vagent starts now
    from a process whose environment is ``environ``: the user's own (or ``keep``) as they are, else
    vagent's choice for the machine as it is now, marked ``auto``. Looks at the machine (up to
    20 ms) only when it decides."""
    if not omp_wait_settings(environ, 0.0, 1):  # keep, or the user's own
        return {k: environ[k] for k in (*WAIT_KEYS, MODE_KEY) if k in environ}
    return {**omp_wait_settings(environ, machine_load(), os.cpu_count() or 1), MODE_KEY: "auto"}


def apply_wait_settings(environ: MutableMapping[str, str] = os.environ) -> dict[str, str]:
    """Give this process the wait settings of a process vagent starts (:func:`child_wait_env`),
    in ``environ``; returns the wait variables it has then. Call before ``import torch`` (libgomp
    reads them when it loads); ValueError for an unknown ``VAGENT_OMP_WAIT``."""
    wanted = child_wait_env(environ)
    for key in (*WAIT_KEYS, MODE_KEY):
        if key not in wanted:
            environ.pop(key, None)
    environ.update(wanted)
    return wanted


@contextlib.contextmanager
def without_own_wait_settings(environ: MutableMapping[str, str] = os.environ) -> Iterator[None]:
    """``environ`` without vagent's own choice while the block runs: a long-lived process started in
    it (Ray's raylet, whose workers inherit its environment) carries only the user's settings, and
    each process started from it gets its own choice (:func:`child_wait_env`) instead of keeping a
    key of this process's choice that its own does not override."""
    own = {k: environ.pop(k) for k in (*WAIT_KEYS, MODE_KEY) if k in environ} if vagents_own(environ) else {}
    try:
        yield
    finally:
        environ.update(own)
