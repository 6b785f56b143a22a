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
import sys
from typing import Sequence


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
    worker succeeded; torchrun prints the failing rank's error otherwise)."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun_main

    os.environ.setdefault("OMP_NUM_THREADS", "1")  # torchrun's own default; threads= in the config overrides
    try:
        torchrun_main(torchrun_args(nproc, train_args, **kw))
    except ChildFailedError as exc:
        print(f"error: the torchrun job failed: {', '.join(f'rank {r}' for r in sorted(exc.failures))} "
              "(their errors are above)", file=sys.stderr)
        return 1
    return 0
