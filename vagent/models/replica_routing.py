"""Where a ``RemoteEngine``'s requests go: the routing state of its replicas (:class:`ReplicaTable`).

- a request with a ``key`` (the rollout sets the trajectory id) goes to the replica that served
  that key before, so a trajectory's turns meet their own KV cache (prefix reuse);
- a new key, or no key, goes to the live replica with the fewest outstanding requests (counted
  over all threads calling ``generate``, so concurrent asynchronous trajectories spread out);
- a dead replica (died, or stuck past its deadline and killed: :mod:`vagent.models.remote`) gets
  nothing more; its keys move to the others as their requests are routed again, and its fate (one
  clause) is kept for the error when none is left (:class:`~vagent.models.replica_actors.NoReplicaLeft`).

The table does no remote call; :class:`vagent.models.remote.RemoteEngine` calls the replicas and
reports what it sees here. Every method may be called from many threads at once.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Sequence

from vagent.models.generation import GenerationRequest
from vagent.models.replica_actors import NoReplicaLeft

logger = logging.getLogger(__name__)


class ReplicaTable:
    """The live replicas, each key's home replica and the requests outstanding on each; ``pids``:
    the replicas' process ids (for the log lines)."""

    def __init__(self, pids: Sequence[int]) -> None:
        replicas = len(pids)
        self.pids = list(pids)
        self._lock = threading.Lock()
        #: whether each replica may still be routed to
        self.alive = [True] * replicas
        #: why each dead replica is dead (one clause each, for the error when none is left)
        self.fate: list[str | None] = [None] * replicas
        #: requests routed to each replica and not yet released
        self.outstanding = [0] * replicas
        #: request key (the trajectory id) -> the replica that served it
        self.home: dict[Any, int] = {}
        #: counters since construction (``retried_requests``: sent again after their replica died)
        self.stats = {"requests": 0, "retried_requests": 0, "dead_replicas": 0}

    def live(self) -> list[int]:
        """The indices of the live replicas."""
        return [i for i, ok in enumerate(self.alive) if ok]

    def route(self, requests: Sequence[GenerationRequest]) -> list[int]:
        """A live replica per request (key affinity, else fewest outstanding); counts them outstanding."""
        with self._lock:
            live = self.live()
            if not live:
                raise NoReplicaLeft(self.none_left("the rollout cannot continue"))
            chosen = []
            for r in requests:
                home = self.home.get(r.key) if r.key is not None else None
                if home is None or not self.alive[home]:
                    home = min(live, key=lambda i: (self.outstanding[i], i))
                    if r.key is not None:
                        self.home[r.key] = home
                self.outstanding[home] += 1
                chosen.append(home)
            return chosen

    def release(self, replica: int, n: int) -> None:
        """``n`` requests routed to ``replica`` are back (answered, or to be routed again)."""
        with self._lock:
            self.outstanding[replica] -= n

    def mark_dead(self, replica: int, fate: str, n_requests: int) -> None:
        """Route nothing more to ``replica``; ``fate``: what happened to it (a clause, logged);
        ``n_requests``: its requests that are sent again to the others (counted)."""
        with self._lock:
            if self.alive[replica]:
                self.alive[replica] = False
                self.fate[replica] = fate
                self.stats["dead_replicas"] += 1
            self.stats["retried_requests"] += n_requests
        logger.warning("engine replica %d (pid %s) %s; sending its %d request(s) to the other replicas",
                       replica, self.pids[replica], fate, n_requests)

    def none_left(self, what: str) -> str:
        """The one-line error when no replica is left: each replica's fate and the timeouts to raise."""
        fates = "; ".join(f"replica {i} {f or 'died'}" for i, f in enumerate(self.fate))
        slow = sorted({s for s in ("rollout.push_timeout_s", "rollout.generate_timeout_s")
                       if any(s in (f or "") for f in self.fate)})
        hint = (f" If the replicas were only slow (a large push on a slow link, a long generate on a slow "
                f"machine), raise {' / '.join(slow)} (seconds; docs/distributed.md, 'Timeouts of remote calls')."
                if slow else "")
        return f"every engine replica is dead ({fates}); {what}.{hint}"
