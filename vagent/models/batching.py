"""``BatchingEngine``: a thread-safe ``Engine`` that merges concurrent ``generate`` calls into batches.

The asynchronous rollout (``vagent.rollout.loop``, ``schedule="async"``) runs each trajectory in
its own thread, and each asks for ONE reply when its env step returns. Calling a model once per
reply would waste the batch; this front gathers the calls that are waiting while the engine is
busy and runs them as one batched call of the
wrapped engine, on one worker thread: after the first waiting call it keeps collecting while new
calls keep arriving less than ``gap_s`` apart (the trajectories whose env steps returned together,
each encoding its prompt in turn), for at most ``max_wait_s``. Calls whose ``SamplingParams`` differ run in separate
batches (requests with their own seeds ignore ``SamplingParams.seed``, so those share batches).

The replies equal the wrapped engine's for the same requests: greedy decoding does not depend on
the batch (up to float rounding, which does not change an argmax except on exact ties), and
seeded sampling does not either when every request carries its own seed
(``GenerationRequest.seed``). Batch-seeded sampling (``SamplingParams.seed`` only) DOES depend on
which requests share a batch: use per-request seeds with this engine.

``exclusive()`` holds the wrapped engine between batches (a weight update must not land in the
middle of one). ``close()`` stops the worker; calls after it raise.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Any, Iterator, Sequence

from vagent.models.engine import GenerationOutput, GenerationRequest, SamplingParams


@dataclasses.dataclass
class _Call:
    requests: list[GenerationRequest]
    params: SamplingParams
    future: Future


def _batch_key(call: _Call) -> tuple[SamplingParams, bool]:
    """Calls with equal keys may share a batch: the params (less the seed when every request has
    its own) and whether the requests carry seeds."""
    own = all(r.seed is not None for r in call.requests)
    return (dataclasses.replace(call.params, seed=None) if own else call.params), own


class BatchingEngine:
    """Merges concurrent ``generate`` calls into batched calls of ``engine`` (module docstring).

    Args:
        engine: the wrapped engine (e.g. ``HFEngine``); only this object's worker thread calls it.
        max_batch: the most requests per batched call.
        gap_s: a batch closes when no new call arrived for this long ...
        max_wait_s: ... or this long after its first call (or when it holds max_batch requests).
    """

    #: ``generate`` may be called from many threads at once
    thread_safe = True

    def __init__(self, engine: Any, *, max_batch: int = 64, gap_s: float = 0.01, max_wait_s: float = 0.05):
        if max_batch < 1 or gap_s < 0 or max_wait_s < 0:
            raise ValueError(f"need max_batch >= 1, gap_s >= 0, max_wait_s >= 0, got {max_batch}, {gap_s}, {max_wait_s}")
        self.engine = engine
        self.encoder = getattr(engine, "encoder", None)
        self.needs_images = bool(getattr(engine, "needs_images", False))
        self.max_batch, self.gap_s, self.max_wait_s = int(max_batch), float(gap_s), float(max_wait_s)
        self._queue: list[_Call] = []
        self._cv = threading.Condition()
        self._engine_lock = threading.Lock()
        self._closed = False
        self._worker: threading.Thread | None = None
        #: counters since construction: batched calls made and requests served
        self.stats = {"batches": 0, "requests": 0}

    def generate(self, requests: Sequence[GenerationRequest], params: SamplingParams) -> list[GenerationOutput]:
        """Queue the requests, wait for their batch to run, return their outputs (thread-safe)."""
        call = _Call(list(requests), params, Future())
        if not call.requests:
            return []
        with self._cv:
            if self._closed:
                raise RuntimeError("BatchingEngine is closed")
            if self._worker is None:
                self._worker = threading.Thread(target=self._run, name="vagent-batching-engine", daemon=True)
                self._worker.start()
            self._queue.append(call)
            self._cv.notify_all()
        return call.future.result()

    @contextmanager
    def exclusive(self) -> Iterator[Any]:
        """Hold the wrapped engine (no batch runs meanwhile); yields it."""
        with self._engine_lock:
            yield self.engine

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        if self._worker is not None:
            self._worker.join(timeout=60)

    # ------------------------------------------------------------------ worker
    def _take(self) -> list[_Call] | None:
        """The next batch: the oldest waiting call and the later ones with the same key (up to max_batch)."""
        with self._cv:
            while not self._queue and not self._closed:
                self._cv.wait()
            if not self._queue:
                return None
            deadline = time.monotonic() + self.max_wait_s
            while not self._closed and sum(len(c.requests) for c in self._queue) < self.max_batch:
                n, left = len(self._queue), deadline - time.monotonic()
                if left <= 0:
                    break
                self._cv.wait(timeout=min(self.gap_s, left))
                if len(self._queue) == n:  # nothing new within gap_s
                    break
            key = _batch_key(self._queue[0])
            batch, rest, n = [], [], 0
            for call in self._queue:
                if _batch_key(call) == key and (not batch or n + len(call.requests) <= self.max_batch):
                    batch.append(call)
                    n += len(call.requests)
                else:
                    rest.append(call)
            self._queue = rest
            return batch

    def _run(self) -> None:
        while True:
            batch = self._take()
            if batch is None:
                return
            requests = [r for call in batch for r in call.requests]
            try:
                with self._engine_lock:
                    outputs = self.engine.generate(requests, batch[0].params)
                if len(outputs) != len(requests):
                    raise RuntimeError(f"engine returned {len(outputs)} outputs for {len(requests)} requests")
            except BaseException as exc:  # noqa: BLE001 -- handed to every waiting caller, who raises it
                for call in batch:
                    call.future.set_exception(exc)
                continue
            self.stats["batches"] += 1
            self.stats["requests"] += len(requests)
            i = 0
            for call in batch:
                call.future.set_result(outputs[i:i + len(call.requests)])
                i += len(call.requests)


__all__ = ["BatchingEngine"]
