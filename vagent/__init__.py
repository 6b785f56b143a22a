"""vagent: train vision-language-model agents with multi-turn reinforcement learning.

Subpackages (the folder tree is the architecture):

- ``vagent.envs``     environment contract, registry, reasoning formats, checker, the envs
- ``vagent.rollout``  the multi-turn loop, Turn/Episode records, token batches with masks
- ``vagent.rl``       advantage estimators, losses and filters as pure tensor functions
- ``vagent.rewards``  reasoning judges (grounding / world-modeling rewards)
- ``vagent.models``   model loading, the tiny VLM builder, critic, generation engines
- ``vagent.recipes``  PPO, GRPO and SFT as readable loops
- ``vagent.service``  HTTP environment server and its client
- ``vagent.eval``     evaluation harness for local and API models
"""

__version__ = "0.1.0"

import os as _os


def omp_wait_settings(environ: dict, load: float, cores: int) -> dict[str, str]:
    """The OpenMP wait settings ``import vagent`` adds to ``environ`` (bench/busy_cpu.py measures them).

    libgomp's workers spin for a while when idle. On a machine whose cores other processes hold,
    spinning workers steal the time the working thread needs: one forward + backward of the
    default run's model beside 2 / 4 busy processes took 2.0-2.5x / 2.8-3.4x its fair share with
    libgomp's default, 0.8-0.9x / 0.7-0.9x with ``OMP_WAIT_POLICY=PASSIVE``, but PASSIVE costs
    1.3-1.4x on an idle machine (tiny models run many small ops), where a bounded spin
    (``GOMP_SPINCOUNT=100000``) costs 1.03x and still helps under load (1.3x / 2.1x of the fair
    share). So: PASSIVE when the machine is busy as vagent starts (``load``, :func:`machine_load`:
    other processes runnable on at least half the cores), else the bounded spin. A user's own
    ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT`` wins, and ``VAGENT_OMP_WAIT=keep`` leaves the
    runtime's default. Results are unchanged (scheduling only); it takes effect when vagent is
    imported before torch (the vagent command, and every process it starts).

    vagent marks its own choice (``VAGENT_OMP_WAIT=auto``), so a process started by another (a
    test's or a launcher's subprocess) decides again for the machine as it is when it starts,
    instead of inheriting a choice made while the machine was idle: the scaled default run beside
    one busy process took 402 s with an inherited ``GOMP_SPINCOUNT=100000`` and 73 s with PASSIVE.
    """
    if environ.get("VAGENT_OMP_WAIT") == "keep":
        return {}
    if environ.get("VAGENT_OMP_WAIT") != "auto" and ("OMP_WAIT_POLICY" in environ or "GOMP_SPINCOUNT" in environ):
        return {}
    return {"OMP_WAIT_POLICY": "PASSIVE"} if load >= 0.5 * max(1, cores) else {"GOMP_SPINCOUNT": "100000"}


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


if omp_wait_settings(dict(_os.environ), 0.0, 1):  # not the user's own: look at the machine (20 ms)
    _choice = omp_wait_settings(dict(_os.environ), machine_load(), _os.cpu_count() or 1)
    for _key in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT"):
        _os.environ.pop(_key, None)
    _os.environ.update(_choice, VAGENT_OMP_WAIT="auto")
