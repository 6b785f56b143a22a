"""The job's collectives, each in one named helper (a recipe never calls torch.distributed).

Every helper returns at once in a single process (no process group, no collective). In a job,
a collective that fails -- usually because another rank died first, or is stuck past the process
group's timeout -- raises :class:`DistributedError` naming this rank and the collective.

Process groups: the helpers use the job's default group, or, in a thread inside
``with on_group(g):``, the group ``g`` from :func:`side_group`. Two threads of a rank may then run
collectives at the same time without mixing them up: the overlapped rollout gathers its episodes
on its own group while the trainer's update runs its collectives on the default one.
"""

from __future__ import annotations

import contextlib
import threading
from datetime import timedelta
from typing import TYPE_CHECKING, Callable, Iterator, Sequence, TypeVar

import torch

from vagent.distributed.world import World, world

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

T = TypeVar("T")

_LOCAL = threading.local()


def side_group(name: str, timeout_s: float | None = None) -> ProcessGroup | None:
    """A second process group over every rank (gloo: CPU objects and tensors), for collectives that
    run in another thread beside the default group's, or that may wait longer than the job's
    ``dist.timeout_s`` (``timeout_s``; default: the job's), used ``with on_group(group):``. Every
    rank must call it, in the same order. A single process: None."""
    w = world()
    if not w.distributed:
        return None
    import torch.distributed as dist

    wait = timedelta(seconds=timeout_s or w.timeout_s or 600.0)
    return collective(f"new_group:{name}", lambda: dist.new_group(backend="gloo", timeout=wait))


@contextlib.contextmanager
def on_group(group: ProcessGroup | None) -> Iterator[None]:
    """The helpers of this module called in this thread inside the block use ``group`` (None: the
    default group)."""
    before = getattr(_LOCAL, "group", None)
    _LOCAL.group = group
    try:
        yield
    finally:
        _LOCAL.group = before


def _group() -> ProcessGroup | None:
    return getattr(_LOCAL, "group", None)


class DistributedError(RuntimeError):
    """A collective failed or timed out; the message names the rank and the collective."""


def collective(name: str, fn: Callable[[], T]) -> T:
    """Run ``fn`` (one torch.distributed call) and turn its failure into a message that says which
    rank, which collective, and what usually causes it."""
    try:
        return fn()
    except (RuntimeError, ValueError) as exc:  # gloo/nccl errors and timeouts are RuntimeErrors
        w = world()
        text = str(exc).strip()
        raise DistributedError(
            f"{w.tag()}: collective '{name}' failed{_lost_ranks(w, text)} ({type(exc).__name__}: {text[:400]}). "
            f"Usually another rank failed first (see its error above) or is stuck; collectives wait at "
            f"most dist.timeout_s={w.timeout_s:g}s.") from exc


def _lost_ranks(w: World, text: str) -> str:
    """``": rank 1 (host 10.0.0.2) closed the connection"`` when the backend's error names the
    address of another host's ranks (its processes ended, or the host is gone); else ``""``."""
    found = w.ranks_at(text)
    if found:
        return f": {_ranks_by_host(found)} closed the connection or stopped answering (its process or host is gone)"
    others = w.other_hosts()
    if others and "timed out" in text.lower():  # a silent host: gloo names no peer
        return (f": no answer within dist.timeout_s={w.timeout_s:g}s; a host that went silent (its network cut, or "
                f"powered off) is the usual cause; the ranks on other hosts: {_ranks_by_host(others)}")
    return ""


def _ranks_by_host(found: dict[str, list[int]]) -> str:
    return "; ".join(f"rank{'s' if len(r) > 1 else ''} {', '.join(map(str, r))} (host {a})" for a, r in found.items())


def barrier(name: str) -> None:
    """Wait until every rank reaches this point (``name`` says which point in an error)."""
    if world().distributed:
        import torch.distributed as dist

        collective(f"barrier:{name}", lambda: dist.barrier(group=_group()))


def all_reduce_sum(values: Sequence[float], name: str = "sum") -> list[float]:
    """Element-wise sums over ranks of a few float64 numbers (the same list length on every rank)."""
    if not world().distributed:
        return [float(v) for v in values]
    import torch.distributed as dist

    t = torch.tensor([float(v) for v in values], dtype=torch.float64)
    collective(f"all_reduce:{name}", lambda: dist.all_reduce(t, op=dist.ReduceOp.SUM, group=_group()))
    return t.tolist()


def global_max(value: int, name: str = "max") -> int:
    """The largest ``value`` over ranks (e.g. micro-batch counts, so every rank runs as many)."""
    if not world().distributed:
        return int(value)
    import torch.distributed as dist

    t = torch.tensor([int(value)], dtype=torch.long)
    collective(f"all_reduce_max:{name}", lambda: dist.all_reduce(t, op=dist.ReduceOp.MAX, group=_group()))
    return int(t.item())


def global_token_count(mask: torch.Tensor, name: str = "tokens") -> float:
    """The number of True/1 entries of ``mask`` summed over ranks (the denominator of a global
    token mean when each rank holds a different part of the batch)."""
    return all_reduce_sum([float(mask.sum())], name)[0]


def gather_objects(obj: T, name: str = "objects") -> list[T]:
    """Every rank's ``obj`` (picklable), in rank order; ``[obj]`` in a single process. Tensors
    should be on the CPU."""
    w = world()
    if not w.distributed:
        return [obj]
    import torch.distributed as dist

    out: list = [None] * w.size
    collective(f"all_gather_object:{name}", lambda: dist.all_gather_object(out, obj, group=_group()))
    return out


def broadcast_object(obj: T, name: str = "broadcast") -> T:
    """Rank 0's ``obj`` on every rank."""
    if not world().distributed:
        return obj
    import torch.distributed as dist

    box = [obj]
    collective(f"broadcast_object:{name}", lambda: dist.broadcast_object_list(box, src=0, group=_group()))
    return box[0]


def gather_metrics(sums: dict[str, float], weights: dict[str, float], name: str = "metrics") -> dict[str, float]:
    """Weighted means over ranks: ``sum_r sums[k] / sum_r weights[k]`` for every key any rank has
    (a key a rank lacks counts 0 there); keys with total weight 0 are left out."""
    if not world().distributed:
        return {k: sums[k] / weights[k] for k in sums if weights[k] > 0}
    keys = sorted(set().union(*gather_objects(sorted(sums), f"{name}:keys")))
    totals = all_reduce_sum([sums.get(k, 0.0) for k in keys] + [weights.get(k, 0.0) for k in keys], name)
    n = len(keys)
    return {k: totals[i] / totals[n + i] for i, k in enumerate(keys) if totals[n + i] > 0}
