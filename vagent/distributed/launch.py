"""``vagent train --nproc N``: start the job with torchrun's own launcher (torch.distributed.run).

    vagent train --nproc 2 steps=10                       # 2 processes on this host
    torchrun --nproc_per_node 2 -m vagent train steps=10   # the same, by hand
    vagent train --nproc 8 --nnodes 2 --node-rank 0 --rdzv-endpoint host0:29400 ...   # on each host

No launcher of our own: this builds torchrun's argument list (``-m vagent train`` plus the
remaining arguments) and calls ``torch.distributed.run.main``, which starts the workers, restarts
nothing (``--max-restarts 0``), stops every worker when one fails, and reports the failing
rank's error. One host: ``--standalone`` rendezvous on a free port; several hosts: c10d
rendezvous at ``--rdzv-endpoint`` (the same on every host; ``--node-rank`` differs).
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Mapping, Sequence


def torchrun_args(nproc: int, train_args: Sequence[str], *, nnodes: int = 1, node_rank: int | None = None,
                  rdzv_endpoint: str | None = None, rdzv_id: str = "vagent") -> list[str]:
    """torchrun's command line (without ``torchrun`` itself) for ``vagent train TRAIN_ARGS``."""
    if nproc < 1:
        raise ValueError(f"--nproc must be >= 1, got {nproc}")
    out = [f"--nproc_per_node={nproc}", f"--nnodes={nnodes}", "--max_restarts=0"]
    if nnodes == 1 and rdzv_endpoint is None:
        out.append("--standalone")
    else:
        if rdzv_endpoint is None:
            raise ValueError(f"--nnodes {nnodes} needs --rdzv-endpoint HOST:PORT (the same on every node), "
                             "e.g. the first node's address and a free port: --rdzv-endpoint node0:29400")
        out += ["--rdzv_backend=c10d", f"--rdzv_endpoint={rdzv_endpoint}", f"--rdzv_id={rdzv_id}"]
        if node_rank is not None:
            out.append(f"--node_rank={node_rank}")
    return out + ["-m", "vagent", "train", *train_args]


def launch(nproc: int, train_args: Sequence[str], **kw) -> int:
    """Run ``vagent train TRAIN_ARGS`` as a torchrun job; returns the job's exit status (0 when every
    worker succeeded; otherwise 1, after saying which rank failed first and how)."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun_main

    from vagent.distributed.world import LAUNCHER_PID_ENV

    os.environ.setdefault("OMP_NUM_THREADS", "1")  # torchrun's own default; threads= in the config overrides
    os.environ[LAUNCHER_PID_ENV] = str(os.getpid())  # the ranks' parent: they end when it does
    try:
        torchrun_main(torchrun_args(nproc, train_args, **kw))
    except ChildFailedError as exc:
        ends = {rank: (f.exitcode, f.timestamp) for rank, f in exc.failures.items()}
        print(f"error: the torchrun job failed: {describe_failure(ends)}", file=sys.stderr)
        return 1
    finally:
        os.environ.pop(LAUNCHER_PID_ENV, None)
    return 0


def _how(rank: int, code: int) -> str:
    if code < 0:
        try:
            return f"rank {rank} was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"rank {rank} was killed by signal {-code}"
    return f"rank {rank} exited with status {code}"


def describe_failure(ends: Mapping[int, tuple[int, float]]) -> str:
    """What ended a failed job, from each failed rank's (exit code, time) in the order torchrun
    found them: the rank that failed first, what the others did, and how to go on. torchrun records
    the ranks that failed on their own before it stops the others (SIGTERM; a rank with Ray's
    signal handlers then aborts), and its times are whole seconds, so the earliest time and then
    the order decide."""
    order = {rank: i for i, rank in enumerate(ends)}
    first = min(ends, key=lambda r: (ends[r][1], order[r]))
    code = ends[first][0]
    text = _how(first, code)
    if code == -signal.SIGKILL:
        text += (" (the kernel's out-of-memory killer sends SIGKILL: check `dmesg` and the host's memory; "
                 "docs/distributed.md 'Memory knobs' lists the settings that need less)")
    elif code > 0:
        text += " (its error is above)"
    others = sorted(r for r in ends if r != first)
    if others:
        text += "; then torchrun stopped the others (" + ", ".join(_how(r, ends[r][0]) for r in others) + ")"
    return text + (". The checkpoints written so far are kept: `vagent train --nproc N --resume <run directory>` "
                   "continues the run.")
