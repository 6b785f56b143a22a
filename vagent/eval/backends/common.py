"""What every API backend shares: concurrency limit, rate limit, retries, error classes, images.

An API backend is an *adapter* (``send(conversation, sampling) -> Reply``, raising
:class:`ApiError` for a failed request) wrapped in :class:`ApiPolicy`, which implements the
``Policy`` protocol:

- **Concurrency**: one ``threading.BoundedSemaphore(concurrency)`` per policy, held for the
  duration of each HTTP request, shared by every ``act`` call of that policy (the runner calls
  ``act`` from several threads at once).
- **Rate limit**: a token bucket of ``requests_per_minute`` with burst ``concurrency``; every
  attempt (retries included) takes a token.
- **Retries** (the SDKs' own retries are disabled so each one is counted here): a request that
  failed with 408, 429, 5xx, a timeout or a connection error is retried up to ``max_retries``
  times. Attempt ``k`` (0-based) waits ``Retry-After`` when the server sent one (``retry-after-ms``
  or ``retry-after`` in seconds or as an HTTP date), else
  ``min(backoff_max_s, backoff_base_s * 2**k) * U(0.5, 1)`` (exponential backoff with "equal"
  jitter). A ``Retry-After`` above ``max_retry_after_s`` fails the request at once. Other 4xx
  (bad request, auth, not found, ...) are never retried.
- **Failure is an error, not a reply**: after the last attempt the reply is
  ``Reply(text="", finish_reason="error", error="...")``; the rollout marks the episode as an
  error (counted and reported), never a zero-reward success (docs/algorithms.md reference bug 8).
- **A total deadline per request**: ``timeout_s`` bounds the whole attempt (connect, sending the
  request, the headers and every byte of the body), not each socket read: the adapters' SDKs get
  an httpx client from :func:`deadline_http_client`, so a server that sends its headers and then
  one byte a second fails the attempt as a timeout after ``timeout_s`` (then retried like any
  timeout).
- **One line per failed reply**: an adapter error or an answer the adapter cannot read (no
  choices, a field of the wrong type) is logged as one warning line naming the backend and the
  error, and recorded on the episode; no traceback per episode (``logging`` at DEBUG shows it).
- **Usage**: ``Reply.usage`` holds ``prompt_tokens`` / ``completion_tokens`` when the API reports
  them, and always ``retries`` (the retries this reply needed).

Stop strings: ``SamplingConfig.stop`` means "stop right AFTER the string" (the string is part of
the reply, as for local models). APIs strip the matched stop sequence, so with
``stop_mode="server"`` the adapter restores it (:func:`restore_stop`); with ``"client"`` no stop
is sent and the reply is cut after the first stop string (exact, costs the extra tokens).

The conversion helpers (images, placeholders, stop strings) are :mod:`vagent.eval.backends.convert`,
the total-deadline HTTP client :mod:`vagent.eval.backends.deadline`; both are re-exported here.
"""

from __future__ import annotations

import email.utils
import logging
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol, Sequence

# the conversion helpers and the deadline client live beside this module; the adapters import them from here
from vagent.eval.backends.convert import (  # noqa: F401
    cut_at_stop, encode_png, interleave, png_base64, restore_stop, split_system, stop_reply, token_usage,
)
from vagent.eval.backends.deadline import DeadlineTransport, deadline_http_client, http_package  # noqa: F401
from vagent.rollout.policy import Conversation, Reply, SamplingConfig

logger = logging.getLogger(__name__)


class ApiError(Exception):
    """A failed API request, classified.

    ``kind``: ``rate_limit`` (429), ``server`` (5xx), ``timeout``, ``connection``, ``client``
    (other 4xx), ``bad_response`` (unparseable answer). ``retry_after``: seconds the server asked
    to wait (None if it did not say).
    """

    def __init__(self, message: str, *, kind: str, status: int | None = None, retry_after: float | None = None):
        super().__init__(message)
        self.kind, self.status, self.retry_after = kind, status, retry_after

    @property
    def retryable(self) -> bool:
        return self.kind in ("rate_limit", "server", "timeout", "connection") or self.status == 408


def kind_of_status(status: int) -> str:
    """``rate_limit`` for 429, ``timeout`` for 408, ``server`` for 5xx, else ``client``."""
    if status == 429:
        return "rate_limit"
    if status == 408:
        return "timeout"
    return "server" if status >= 500 else "client"


def parse_retry_after(headers: Mapping[str, str] | None, now: float | None = None) -> float | None:
    """Seconds to wait from ``retry-after-ms`` or ``retry-after`` (seconds or HTTP date); None if absent/bad."""
    if not headers:
        return None
    lower = {str(k).lower(): v for k, v in headers.items()}
    ms = lower.get("retry-after-ms")
    if ms is not None:
        try:
            return max(0.0, float(ms) / 1000.0)
        except ValueError:
            pass
    value = lower.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def backoff_delay(attempt: int, base: float, cap: float, u: float) -> float:
    """``min(cap, base * 2**attempt) * (0.5 + 0.5 * u)`` for ``u`` in [0, 1): exponential, jittered."""
    return min(cap, base * (2.0 ** attempt)) * (0.5 + 0.5 * u)


class TokenBucket:
    """A thread-safe token bucket: ``rate_per_minute`` tokens a minute, at most ``burst`` saved.

    ``acquire()`` reserves a token (the balance may go negative: later callers queue behind it)
    and sleeps until that token exists; it returns the seconds slept. Rate 0 = unlimited.
    """

    def __init__(self, rate_per_minute: float, burst: int = 1, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep):
        self.rate = float(rate_per_minute) / 60.0
        self.burst = max(1, int(burst))
        self._clock, self._sleep = clock, sleep
        self._tokens = float(self.burst)
        self._last = clock()
        self._lock = threading.Lock()

    def acquire(self) -> float:
        if self.rate <= 0:
            return 0.0
        with self._lock:
            now = self._clock()
            self._tokens = min(float(self.burst), self._tokens + (now - self._last) * self.rate)
            self._last = now
            self._tokens -= 1.0
            wait = -self._tokens / self.rate if self._tokens < 0 else 0.0
        if wait > 0:
            self._sleep(wait)
        return wait


@dataclass
class ApiStats:
    """Counters of one API policy (thread-safe through ``add``); reported per model in summary.json."""

    requests: int = 0  # attempts sent, retries included
    replies: int = 0  # requests that returned a reply
    failures: int = 0  # replies turned into errors after the last attempt (or a non-retryable error)
    retries: int = 0
    rate_limited: int = 0  # 429 answers
    server_errors: int = 0  # 5xx answers
    timeouts: int = 0  # timeouts and 408
    connection_errors: int = 0
    client_errors: int = 0  # other 4xx (not retried)
    bad_responses: int = 0
    rate_wait_s: float = 0.0  # seconds spent waiting for the rate limiter
    backoff_wait_s: float = 0.0  # seconds spent sleeping between attempts
    prompt_tokens: int = 0
    completion_tokens: int = 0
    max_in_flight: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **deltas: float) -> None:
        with self._lock:
            for k, v in deltas.items():
                setattr(self, k, getattr(self, k) + v)

    def as_dict(self) -> dict[str, float]:
        with self._lock:
            return {k: v for k, v in self.__dict__.items() if not k.startswith("_")}


_KIND_COUNTER = {"rate_limit": "rate_limited", "server": "server_errors", "timeout": "timeouts",
                 "connection": "connection_errors", "client": "client_errors", "bad_response": "bad_responses"}


class Adapter(Protocol):
    """One API's wire format: send one conversation, return the reply or raise :class:`ApiError`."""

    backend: str

    def send(self, conversation: Conversation, sampling: SamplingConfig) -> Reply: ...


class ApiPolicy:
    """The ``Policy`` protocol for an API adapter: limits, retries and error replies (module docstring).

    Args:
        adapter: the wire-format adapter (openai, anthropic, gemini).
        concurrency: the most requests in flight (one semaphore for every ``act`` call).
        requests_per_minute: rate limit (0 = none).
        max_retries, backoff_base_s, backoff_max_s, max_retry_after_s: the retry schedule.
        rng: jitter source (``random.Random``); seeded for tests.
        sleep: the sleep function (tests may record delays).
    """

    def __init__(self, adapter: Adapter, *, concurrency: int = 4, requests_per_minute: float = 0.0,
                 max_retries: int = 4, backoff_base_s: float = 1.0, backoff_max_s: float = 30.0,
                 max_retry_after_s: float = 120.0, rng: random.Random | None = None,
                 sleep: Callable[[float], None] = time.sleep):
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        self.adapter = adapter
        self.concurrency = int(concurrency)
        self.max_retries = int(max_retries)
        self.backoff_base_s, self.backoff_max_s = float(backoff_base_s), float(backoff_max_s)
        self.max_retry_after_s = float(max_retry_after_s)
        self.stats = ApiStats()
        self._semaphore = threading.BoundedSemaphore(self.concurrency)
        self._bucket = TokenBucket(requests_per_minute, burst=self.concurrency, sleep=sleep)
        self._rng = rng or random.Random()
        self._rng_lock = threading.Lock()
        self._sleep = sleep
        self._in_flight = 0
        self._pool = ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix=f"{adapter.backend}-api")

    @classmethod
    def from_spec(cls, adapter: Adapter, spec: Any, **kw: Any) -> "ApiPolicy":
        """An ApiPolicy with the limits of a :class:`vagent.eval.config.ModelSpec`."""
        return cls(adapter, concurrency=spec.concurrency, requests_per_minute=spec.requests_per_minute,
                   max_retries=spec.max_retries, backoff_base_s=spec.backoff_base_s,
                   backoff_max_s=spec.backoff_max_s, max_retry_after_s=spec.max_retry_after_s, **kw)

    def act(self, conversations: Sequence[Conversation], sampling: SamplingConfig) -> list[Reply]:
        """One reply per conversation, requested in parallel (at most ``concurrency`` at once)."""
        if len(conversations) == 1:
            return [self.answer(conversations[0], sampling)]
        futures = [self._pool.submit(self.answer, c, sampling) for c in conversations]
        return [f.result() for f in futures]

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        close = getattr(self.adapter, "close", None)
        if close is not None:
            close()

    def _jitter(self) -> float:
        with self._rng_lock:
            return self._rng.random()

    def _attempt(self, conversation: Conversation, sampling: SamplingConfig) -> Reply:
        with self._semaphore:
            self.stats.add(rate_wait_s=self._bucket.acquire(), requests=1)
            with self.stats._lock:
                self._in_flight += 1
                self.stats.max_in_flight = max(self.stats.max_in_flight, self._in_flight)
            try:
                return self.adapter.send(conversation, sampling)
            finally:
                with self.stats._lock:
                    self._in_flight -= 1

    def answer(self, conversation: Conversation, sampling: SamplingConfig) -> Reply:
        """One conversation's reply, with retries; a final failure is ``Reply(error=...)``."""
        backend = self.adapter.backend
        for attempt in range(self.max_retries + 1):
            try:
                reply = self._attempt(conversation, sampling)
            except ApiError as exc:
                err = exc
            except Exception as exc:  # noqa: BLE001 -- an adapter bug or odd answer: an error reply, one line
                logger.debug("%s adapter raised", backend, exc_info=True)
                err = ApiError(f"unreadable answer: {one_line(f'{type(exc).__name__}: {exc}')}", kind="bad_response")
            else:
                usage = dict(reply.usage)
                usage["retries"] = attempt
                reply.usage = usage
                self.stats.add(replies=1, prompt_tokens=usage.get("prompt_tokens", 0),
                               completion_tokens=usage.get("completion_tokens", 0))
                return reply
            self.stats.add(**{_KIND_COUNTER[err.kind]: 1})
            where = f"{backend}: {err.kind}" + (f" (HTTP {err.status})" if err.status else "")
            if not err.retryable:
                return self._failed(f"{where}, not retried: {err}", attempt)
            if attempt == self.max_retries:
                return self._failed(f"{where} after {attempt + 1} attempts: {err}", attempt)
            if err.retry_after is not None:
                if err.retry_after > self.max_retry_after_s:
                    return self._failed(f"{where}: server asked to retry after {err.retry_after:.0f} s, more than "
                                        f"max_retry_after_s={self.max_retry_after_s:.0f}: {err}", attempt)
                delay = err.retry_after
            else:
                delay = backoff_delay(attempt, self.backoff_base_s, self.backoff_max_s, self._jitter())
            logger.info("%s; retry %d/%d in %.2f s", where, attempt + 1, self.max_retries, delay)
            self.stats.add(retries=1, backoff_wait_s=delay)
            self._sleep(delay)
        raise AssertionError("unreachable")

    def _failed(self, message: str, retries: int) -> Reply:
        self.stats.add(failures=1)
        message = one_line(message)
        logger.warning("request failed: %s", message)
        return Reply(text="", finish_reason="error", error=message, usage={"retries": retries})


def one_line(text: str, limit: int = 400) -> str:
    """``text`` on one line (newlines and runs of spaces folded), at most ``limit`` characters."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


__all__ = [
    "ApiError", "ApiPolicy", "ApiStats", "Adapter", "TokenBucket", "backoff_delay", "parse_retry_after",
    "DeadlineTransport", "deadline_http_client", "http_package", "one_line",
    "kind_of_status", "encode_png", "png_base64", "interleave", "cut_at_stop", "restore_stop",
    "stop_reply", "token_usage", "split_system",
]
