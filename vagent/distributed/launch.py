"""``vagent train --nproc N``: start the job with torchrun's own launcher (torch.distributed.run).

    vagent train --nproc 2 steps=10                       # 2 processes on this host
    torchrun --nproc_per_node 2 -m vagent train steps=10   # the same, by hand
    vagent train --nproc 8 --nnodes 2 --node-rank R --rdzv-endpoint host0:29400 ...   # host R of 0, 1

No launcher of our own: this builds torchrun's argument list (``-m vagent train`` plus the
remaining arguments) and calls ``torch.distributed.run.main``, which starts the workers, restarts
nothing (``--max-restarts 0``), stops every worker when one fails, and reports the failing
rank's error. One host: ``--standalone`` rendezvous on a free port. Several hosts:

- with ``--node-rank R`` (0..nnodes-1, one per host): torchrun's *static* rendezvous. Host R runs
  global ranks R*nproc .. R*nproc+nproc-1, so global rank 0 (the one that writes the run
  directory) is on node rank 0, and ``--rdzv-endpoint`` must be node rank 0's address: its agent
  serves the job's TCPStore there. (torchrun ignores ``--node_rank`` under c10d.)
- without ``--node-rank``: torchrun's c10d rendezvous at ``--rdzv-endpoint``; it numbers the
  hosts in the order of their sorted names (FQDN, then the agent's PID), wherever the endpoint is.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Mapping, Sequence

from vagent.startup import heavy_imports


def torchrun_args(nproc: int, train_args: Sequence[str], *, nnodes: int = 1, node_rank: int | None = None,
                  rdzv_endpoint: str | None = None, rdzv_id: str = "vagent") -> list[str]:
    """torchrun's command line (without ``torchrun`` itself) for ``vagent train TRAIN_ARGS``."""
    if nproc < 1:
        raise ValueError(f"--nproc must be >= 1, got {nproc}")
    if node_rank is not None and not 0 <= node_rank < nnodes:
        raise ValueError(f"--node-rank must be in 0..{nnodes - 1} (--nnodes {nnodes}), got {node_rank}: give "
                         "each host its own, and 0 to the host of --rdzv-endpoint")
    out = [f"--nproc_per_node={nproc}", f"--nnodes={nnodes}", "--max_restarts=0"]
    if nnodes == 1 and rdzv_endpoint is None:
        return out + ["--standalone", "-m", "vagent", "train", *train_args]
    if rdzv_endpoint is None:
        raise ValueError(f"--nnodes {nnodes} needs --rdzv-endpoint HOST:PORT (the same on every node), "
                         "e.g. node rank 0's address and a free port: --rdzv-endpoint node0:29400")
    if node_rank is not None:  # static: node rank R holds global ranks R*nproc.., node rank 0 serves the store
        out += ["--rdzv_backend=static", f"--rdzv_endpoint={rdzv_endpoint}", f"--node_rank={node_rank}",
                f"--rdzv_id={rdzv_id}"]
    else:  # c10d: hosts numbered by sorted name
        out += ["--rdzv_backend=c10d", f"--rdzv_endpoint={rdzv_endpoint}", f"--rdzv_id={rdzv_id}"]
    return out + ["-m", "vagent", "train", *train_args]


def new_run_dirs(out_dir: str | Path, name: str, since: float, before: set[Path]) -> list[Path]:
    """The run directories ``<out_dir>/<name>-<stamp>`` a job made: not in ``before`` (listed
    before it started) and changed at ``since`` or later; newest first."""
    parent = Path(out_dir).expanduser()
    if not parent.is_dir():
        return []
    found = [p for p in parent.glob(f"{name}-*") if p.is_dir() and p not in before and p.stat().st_mtime >= since - 1]
    return sorted(found, key=lambda p: p.stat().st_mtime, reverse=True)


def launch(nproc: int, train_args: Sequence[str], *, nnodes: int = 1, node_rank: int | None = None,
           rdzv_endpoint: str | None = None, rdzv_id: str = "vagent", run_dir: str | None = None,
           out_dir: str | Path | None = None, run_name: str | None = None) -> int:
    """Run ``vagent train TRAIN_ARGS`` as a torchrun job (the hosts and rendezvous as
    :func:`torchrun_args` takes them); returns the job's exit status (0 when every worker succeeded;
    otherwise 1, after saying which rank failed first and how).

    The failure line names the run directory to resume: ``run_dir`` (a ``--resume``), else the
    directory ``<out_dir>/<run_name>-<stamp>`` the job made; when it made none (a rank failed
    before rank 0 wrote it) there is nothing to resume and the line says so."""
    before: set[Path] = set()
    if run_dir is None and out_dir is not None and run_name is not None and Path(out_dir).expanduser().is_dir():
        before = set(Path(out_dir).expanduser().glob(f"{run_name}-*"))
    started = time.time()
    with heavy_imports():  # vagent/startup.py
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
        from torch.distributed.run import main as torchrun_main

        from vagent.distributed.world import LAUNCHER_PID_ENV

    os.environ.setdefault("OMP_NUM_THREADS", "1")  # torchrun's own default; threads= in the config overrides
    os.environ[LAUNCHER_PID_ENV] = str(os.getpid())  # the ranks' parent: they end when it does
    try:
        torchrun_main(torchrun_args(nproc, train_args, nnodes=nnodes, node_rank=node_rank,
                                    rdzv_endpoint=rdzv_endpoint, rdzv_id=rdzv_id))
    except ChildFailedError as exc:
        ends = {rank: (f.exitcode, f.timestamp) for rank, f in exc.failures.items()}
        if run_dir is None and out_dir is not None and run_name is not None:
            made = new_run_dirs(out_dir, run_name, started, before)
            run_dir = str(made[0]) if made else None
        hosts = resume_hosts(nnodes, node_rank, rdzv_endpoint)
        said = describe_failure(ends, run_dir, nproc=nproc, hosts=hosts, newest=newest_checkpoint(run_dir))
        print(f"error: the torchrun job failed: {said}", file=sys.stderr)
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


def describe_failure(ends: Mapping[int, tuple[int, float]], run_dir: str | Path | None = "<run directory>",
                     nproc: int | str = "N", hosts: str = "", newest: str | None = None) -> str:
    """What ended a failed job, from each failed rank's (exit code, time) in the order torchrun
    found them: the rank that failed first, what the others did, and how to go on (``--resume
    run_dir`` with ``nproc`` processes, and on every host of a job of several with ``hosts``, the
    host arguments of :func:`resume_hosts`; with ``run_dir`` None the job wrote no run directory,
    so there is nothing to resume and no resume command is given); ``newest``: the name of the
    newest checkpoint there, which the resume starts from. torchrun records
    the ranks that failed on their own before it stops the others (SIGTERM; a rank with Ray's
    signal handlers then aborts), and its times are whole seconds, so the earliest time and then
    the order decide."""
    order = {rank: i for i, rank in enumerate(ends)}
    first = min(ends, key=lambda r: (ends[r][1], order[r]))
    code = ends[first][0]
    text = _how(first, code)
    from vagent.exit_codes import REFUSED_EXIT

    if code == REFUSED_EXIT:
        text += (" (it refused to run: its error above names the config field or checkpoint to fix)")
        others = sorted(r for r in ends if r != first)
        if others:
            text += "; then torchrun stopped the others (" + ", ".join(_how(r, ends[r][0]) for r in others) + ")"
        return text + (". Rerunning the same command refuses again: fix what the error says first"
                       + (f"; the checkpoints in {run_dir} are kept" if run_dir is not None else "") + ".")
    if code == -signal.SIGKILL:
        text += (" (the kernel's out-of-memory killer sends SIGKILL: check `dmesg` and the host's memory; "
                 "docs/distributed.md 'Memory knobs' lists the settings that need less)")
    elif code > 0:
        text += " (its error is above)"
    others = sorted(r for r in ends if r != first)
    if others:
        text += "; then torchrun stopped the others (" + ", ".join(_how(r, ends[r][0]) for r in others) + ")"
    if run_dir is None:
        return text + ". No run directory was written, so there is nothing to resume."
    kept = "The checkpoints written so far are kept" + (f" (the newest: {newest})" if newest else "")
    if hosts:
        return text + (f". {kept}: `vagent train --nproc {nproc} {hosts} --resume "
                       f"{run_dir}` on every host (each with its own --node-rank) continues the run.")
    return text + f". {kept}: `vagent train --nproc {nproc} --resume {run_dir}` continues the run."


def newest_checkpoint(run_dir: str | Path | None) -> str | None:
    """The folder name of the newest checkpoint in ``run_dir/checkpoints`` (None without one)."""
    if run_dir is None:
        return None
    from vagent.runs.checkpoint import list_checkpoints

    found = list_checkpoints(Path(run_dir) / "checkpoints")
    return found[-1].path.name if found else None


def resume_hosts(nnodes: int, node_rank: int | None, rdzv_endpoint: str | None) -> str:
    """The host arguments a job of ``nnodes`` hosts resumes with (empty for one host): the same
    ``--nnodes`` and ``--rdzv-endpoint``, and ``--node-rank R`` when the job used static ranks."""
    if nnodes <= 1:
        return ""
    ranks = " --node-rank R" if node_rank is not None else ""
    return f"--nnodes {nnodes}{ranks} --rdzv-endpoint {rdzv_endpoint}"
