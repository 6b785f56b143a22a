"""The server's counters and latency windows (``GET /metrics``, docs/metrics/service.md)."""

from __future__ import annotations

import math
import os
import time
from collections import Counter, deque
from typing import Any, Collection


class Metrics:
    """Counters and latency windows, served at ``/metrics`` under the ``service/`` prefix."""

    #: the counters, each served as ``service/<name>`` (docs/metrics/service.md)
    COUNTERS = ("sessions_created", "sessions_closed", "sessions_expired", "sessions_lost", "worker_restarts",
                "steps", "resets", "env_errors", "replays_served", "admission_rejects")

    def __init__(self, window: int = 4096) -> None:
        self.counts: Counter = Counter({k: 0 for k in self.COUNTERS})
        self.requests: Counter = Counter()
        self.statuses: Counter = Counter()
        self.latency: dict[str, deque] = {}
        self.all_latency: deque = deque(maxlen=window)
        self.window = window
        self.started = time.time()

    def record(self, route: str, status: int, seconds: float) -> None:
        self.requests[route] += 1
        self.statuses[(route, status)] += 1
        self.latency.setdefault(route, deque(maxlen=self.window)).append(seconds)
        self.all_latency.append(seconds)

    @staticmethod
    def _pct(values: Collection[float], q: float) -> float | None:
        """Nearest-rank percentile: the ceil(q * n)-th smallest value."""
        if not values:
            return None
        s = sorted(values)
        return s[max(0, math.ceil(q * len(s)) - 1)]

    def snapshot(self, extra: dict[str, Any]) -> dict[str, Any]:
        total = sum(self.requests.values())
        err4 = sum(n for (r, s), n in self.statuses.items() if 400 <= s < 500)
        err5 = sum(n for (r, s), n in self.statuses.items() if s >= 500)
        ms = lambda v: None if v is None else round(v * 1000, 3)  # noqa: E731
        out: dict[str, Any] = {
            "service/uptime_s": round(time.time() - self.started, 3),
            "service/requests": total,
            "service/errors_4xx": err4,
            "service/errors_5xx": err5,
            "service/latency_p50_ms": ms(self._pct(self.all_latency, 0.50)),
            "service/latency_p99_ms": ms(self._pct(self.all_latency, 0.99)),
        }
        out.update({f"service/{k}": v for k, v in sorted(self.counts.items())})
        out.update(extra)
        routes = {}
        for route, n in sorted(self.requests.items()):
            lat = self.latency.get(route, ())
            routes[route] = {
                "requests": n,
                "errors": sum(c for (r, s), c in self.statuses.items() if r == route and s >= 400),
                "statuses": {str(s): c for (r, s), c in sorted(self.statuses.items()) if r == route},
                "p50_ms": ms(self._pct(lat, 0.50)),
                "p99_ms": ms(self._pct(lat, 0.99)),
            }
        out["routes"] = routes
        return out


def rss_bytes(pid: int) -> int | None:
    """Resident set size of process ``pid`` in bytes (Linux /proc; None elsewhere)."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None
