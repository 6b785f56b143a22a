"""The LLM judge: any OpenAI-compatible chat endpoint judges descriptions (docs/algorithms.md reference section 7).

Two modes:

- ``yesno``: the model sees the true state (one line per object relation, plus the grid when the
  env has a legend) and the description, and answers YES or NO;
  score 1.0 or 0.0 (VAGEN legacy's navigation/manipulation judge);
- ``parse``: the model turns the description into a JSON list of
  ``{"object", "vertical", "horizontal"}``; the rule judge's matching F1 scores it against the
  state (VAGEN legacy's grid judge). The prompt holds no state, so one parse serves every state.

Operation (one :meth:`LLMJudge.score` call = the whole rollout batch):

- all items are sent concurrently (``asyncio.gather``-style), at most ``concurrency`` requests in
  flight; identical prompts in a batch are sent once; answers are cached (LRU of ``cache_size``)
  by ``sha256(model, mode, temperature, max_tokens, messages)``: the messages hold the description
  and, in yesno mode, the state;
- each request has a ``timeout_s``; the SDK's own retries are off (``max_retries=0``) so that every
  retry is ours and counted: 429 waits for ``Retry-After`` (or ``retry-after-ms``; capped at
  ``max_retry_after_s``), timeouts / connection errors / 5xx / 408 / 409 / unparseable answers
  back off exponentially, ``min(max_backoff_s, backoff_s * 2**attempt) * U(0.5, 1)`` (jitter);
  other 4xx are not retried; 401/403/404 raise :class:`LLMJudgeError` (a wrong key, model name or
  URL: fix the config);
- the whole call ends by ``deadline_s``: unfinished requests are cancelled. Items without a
  verdict get the ``fallback`` (``"rule"``: the rule judge's score, or ``"zero"``), marked
  ``fallback=True`` and counted in ``last_stats`` - training never hangs on the judge;
- :meth:`score` is synchronous: it runs its own event loop (in a worker thread if the caller is
  already inside a running loop); async callers can ``await ascore(items)``.
"""

from __future__ import annotations

import asyncio
import os
import random
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Sequence, TypeVar

from vagent.config import ConfigError
from vagent.eval.backends.common import parse_retry_after
from vagent.rewards.base import JudgeItem, JudgeResult
from vagent.rewards.llm_prompts import (  # noqa: F401 -- the prompts stay importable from here
    cache_key, parse_messages, parse_yesno, score_parsed_answer, state_text, yesno_messages,
)
from vagent.rewards.parse import load_structured
from vagent.rewards.rule import RuleJudge, RuleJudgeConfig, clip_reason

T = TypeVar("T")

MODES = ("yesno", "parse")
FALLBACKS = ("rule", "zero")


class LLMJudgeError(RuntimeError):
    """The judge endpoint rejected the configuration (401/403/404): wrong key, model or URL."""


@dataclass
class LLMJudgeConfig:
    """Options of the LLM judge (any OpenAI-compatible chat endpoint)."""

    #: base URL of the OpenAI-compatible API (OpenAI, vLLM, SGLang, `transformers serve`, ...)
    base_url: str = "http://127.0.0.1:8000/v1"
    #: model name sent with each request (VAGEN legacy used gpt-4.1-nano)
    model: str = "gpt-4.1-nano"
    #: name of the environment variable holding the API key (unset -> "EMPTY", fine for local servers)
    api_key_env: str = "OPENAI_API_KEY"
    #: "yesno" (the LLM answers YES/NO given the state) or "parse" (the LLM writes JSON relations that the rule scores)
    mode: str = "yesno"
    #: sampling temperature of the judge (VAGEN legacy: 0.1)
    temperature: float = 0.1
    #: max tokens of an answer; 0 = the mode's default (16 for yesno, 400 for parse)
    max_tokens: int = 0
    #: seconds before one request times out
    timeout_s: float = 20.0
    #: retries per request after the first attempt (on 429, 5xx, timeouts, connection errors, garbage)
    max_retries: int = 3
    #: first backoff in seconds (doubles each retry, with jitter)
    backoff_s: float = 0.5
    #: the longest backoff in seconds
    max_backoff_s: float = 8.0
    #: the longest Retry-After (seconds) honoured; a longer one is capped to this
    max_retry_after_s: float = 30.0
    #: requests in flight at once
    concurrency: int = 32
    #: seconds one score() call may take in all; unfinished items get the fallback
    deadline_s: float = 120.0
    #: answers kept in the in-memory cache (0 = no cache)
    cache_size: int = 100_000
    #: what scores an item the LLM could not judge: "rule" (the rule judge) or "zero"
    fallback: str = "rule"
    #: seed of the backoff jitter
    seed: int = 0

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"llm.mode: expected one of {MODES}, got {self.mode!r}.")
        if self.fallback not in FALLBACKS:
            raise ConfigError(f"llm.fallback: expected one of {FALLBACKS}, got {self.fallback!r}.")
        if self.concurrency < 1:
            raise ConfigError(f"llm.concurrency: expected >= 1, got {self.concurrency}.")
        if self.timeout_s <= 0 or self.deadline_s <= 0:
            raise ConfigError(f"llm.timeout_s and llm.deadline_s must be > 0, got {self.timeout_s}, {self.deadline_s}.")
        if self.max_retries < 0 or self.cache_size < 0 or self.max_tokens < 0:
            raise ConfigError("llm.max_retries, llm.cache_size and llm.max_tokens must be >= 0.")
        if not self.base_url.startswith(("http://", "https://")):
            raise ConfigError(f"llm.base_url: expected an http(s) URL such as http://127.0.0.1:8000/v1, got {self.base_url!r}.")


# ---------------------------------------------------------------------------------------------
# Sync entry to the async judge (the prompts and the reading of answers: vagent.rewards.llm_prompts)
# ---------------------------------------------------------------------------------------------

def run_sync(factory: Callable[[], Awaitable[T]]) -> T:
    """Run ``factory()`` to completion from sync code: ``asyncio.run`` here, or in a worker
    thread with its own loop when this thread already runs an event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(factory())
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(lambda: asyncio.run(factory())).result()


# ---------------------------------------------------------------------------------------------
# The judge
# ---------------------------------------------------------------------------------------------

_STATS = ("items", "requests", "unique_prompts", "cache_hits", "retries", "rate_limited", "server_errors",
          "timeouts", "connection_errors", "parse_errors", "client_errors", "failed", "fallbacks", "deadline_hits")


class LLMJudge:
    """Judges through an OpenAI-compatible endpoint; see the module docstring."""

    def __init__(self, config: LLMJudgeConfig | None = None, rule_config: RuleJudgeConfig | None = None) -> None:
        self.config = config or LLMJudgeConfig()
        self.rule_config = rule_config or RuleJudgeConfig()
        self._cache: OrderedDict[str, str] = OrderedDict()
        self._rng = random.Random(self.config.seed)
        self.last_stats: dict[str, float] = {}

    # -- public -----------------------------------------------------------------------------
    def score(self, items: Sequence[JudgeItem]) -> list[JudgeResult]:
        """Judge all ``items`` (blocking; bounded by ``deadline_s`` plus the fallback's time)."""
        items = list(items)
        if not items:
            self.last_stats = {k: 0.0 for k in _STATS}
            return []
        return run_sync(lambda: self.ascore(items))

    async def ascore(self, items: Sequence[JudgeItem]) -> list[JudgeResult]:
        cfg = self.config
        stats = {k: 0.0 for k in _STATS}
        stats["items"] = float(len(items))
        messages = [self._messages(it) for it in items]
        max_tokens = self._max_tokens()
        keys = [cache_key(cfg.model, cfg.mode, cfg.temperature, max_tokens, m) for m in messages]
        answers: dict[str, str] = {}
        failures: dict[str, str] = {}
        todo: dict[str, list[dict[str, str]]] = {}
        for key, msg in zip(keys, messages):
            if key in self._cache:
                answers[key] = self._cache[key]
                self._cache.move_to_end(key)
                stats["cache_hits"] += 1
            elif key not in todo:
                todo[key] = msg
        stats["unique_prompts"] = float(len(todo) + len({k for k in keys if k in answers}))
        if todo:
            await self._fetch_all(todo, answers, failures, stats, max_tokens)
        results = self._verdicts(items, keys, answers, failures, stats)
        self.last_stats = stats
        return results

    # -- internals --------------------------------------------------------------------------
    def _messages(self, item: JudgeItem) -> list[dict[str, str]]:
        return yesno_messages(item) if self.config.mode == "yesno" else parse_messages(item)

    def _max_tokens(self) -> int:
        return self.config.max_tokens or (16 if self.config.mode == "yesno" else 400)

    def _check_answer(self, answer: str) -> None:
        """Raise ValueError if ``answer`` is garbage for this mode (so it is retried, not cached)."""
        if self.config.mode == "yesno":
            parse_yesno(answer)
        elif load_structured(answer or "") is None:
            raise ValueError(f"no JSON in the judge's answer: {(answer or '')[:80]!r}")

    async def _fetch_all(self, todo: dict[str, list[dict[str, str]]], answers: dict[str, str],
                         failures: dict[str, str], stats: dict[str, float], max_tokens: int) -> None:
        from openai import AsyncOpenAI

        cfg = self.config
        loop = asyncio.get_running_loop()
        deadline = loop.time() + cfg.deadline_s
        sem = asyncio.Semaphore(cfg.concurrency)
        client = AsyncOpenAI(base_url=cfg.base_url, api_key=os.environ.get(cfg.api_key_env) or "EMPTY",
                             timeout=cfg.timeout_s, max_retries=0)
        try:
            tasks = {asyncio.ensure_future(self._request(client, sem, msg, deadline, stats, max_tokens)): key
                     for key, msg in todo.items()}
            done, pending = await asyncio.wait(tasks, timeout=max(0.0, deadline - loop.time()) + 0.5,
                                               return_when=asyncio.FIRST_EXCEPTION)
            fatal = next((t.exception() for t in done if t.exception() is not None), None)
            for t in pending:
                t.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
            if fatal is not None:
                raise fatal
            for task, key in tasks.items():
                if task in done:
                    ok, value = task.result()
                    (answers if ok else failures)[key] = value
                else:
                    failures[key] = "deadline"
                    stats["deadline_hits"] += 1
        finally:
            await client.close()
        for key, answer in answers.items():
            if key in todo and cfg.cache_size > 0:
                self._cache[key] = answer
                while len(self._cache) > cfg.cache_size:
                    self._cache.popitem(last=False)

    def _backoff(self, attempt: int) -> float:
        cfg = self.config
        return min(cfg.max_backoff_s, cfg.backoff_s * 2 ** attempt) * (0.5 + 0.5 * self._rng.random())

    async def _request(self, client: Any, sem: asyncio.Semaphore, messages: list[dict[str, str]], deadline: float,
                       stats: dict[str, float], max_tokens: int) -> tuple[bool, str]:
        """(True, answer) or (False, reason); raises LLMJudgeError on 401/403/404."""
        import openai

        cfg = self.config
        loop = asyncio.get_running_loop()
        reason = "deadline"
        for attempt in range(cfg.max_retries + 1):
            if attempt:
                stats["retries"] += 1
            wait = None
            async with sem:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    stats["deadline_hits"] += 1
                    return False, reason
                stats["requests"] += 1
                try:
                    timeout = min(cfg.timeout_s, remaining)
                    resp = await asyncio.wait_for(
                        client.chat.completions.create(model=cfg.model, messages=messages, temperature=cfg.temperature,
                                                       max_tokens=max_tokens, timeout=timeout),
                        timeout + 1.0)
                    answer = resp.choices[0].message.content or ""
                    self._check_answer(answer)
                    return True, answer
                except (openai.AuthenticationError, openai.PermissionDeniedError, openai.NotFoundError) as exc:
                    raise LLMJudgeError(
                        f"LLM judge at {cfg.base_url} answered {exc.status_code} for model {cfg.model!r}: "
                        f"{str(exc)[:200]}. Check llm.base_url, llm.model and the key in ${cfg.api_key_env}."
                    ) from exc
                except openai.RateLimitError as exc:
                    stats["rate_limited"] += 1
                    reason = "rate_limited"
                    ra = parse_retry_after(exc.response.headers)
                    wait = min(ra, cfg.max_retry_after_s) if ra is not None else None
                except (openai.APITimeoutError, asyncio.TimeoutError):
                    stats["timeouts"] += 1
                    reason = "timeout"
                except openai.APIConnectionError:
                    stats["connection_errors"] += 1
                    reason = "connection_error"
                except openai.APIStatusError as exc:
                    if exc.status_code >= 500 or exc.status_code in (408, 409):
                        stats["server_errors"] += 1
                        reason = f"http_{exc.status_code}"
                    else:
                        stats["client_errors"] += 1
                        return False, f"http_{exc.status_code}"
                except (openai.APIError, ValueError, TypeError, AttributeError, IndexError) as exc:
                    stats["parse_errors"] += 1
                    reason = f"garbage: {str(exc)[:120] if isinstance(exc, ValueError) else type(exc).__name__}"
            if attempt == cfg.max_retries:
                break
            wait = self._backoff(attempt) if wait is None else wait
            if loop.time() + wait >= deadline:
                stats["deadline_hits"] += 1
                return False, f"{reason} (next retry past the deadline)"
            await asyncio.sleep(wait)
        return False, reason

    def _verdicts(self, items: Sequence[JudgeItem], keys: list[str], answers: dict[str, str],
                  failures: dict[str, str], stats: dict[str, float]) -> list[JudgeResult]:
        results: list[JudgeResult | None] = [None] * len(items)
        fallback_idx = []
        for i, (item, key) in enumerate(zip(items, keys)):
            if key not in answers:
                fallback_idx.append(i)
                continue
            answer = answers[key]
            detail: dict[str, Any] = {"judge": "llm", "mode": self.config.mode, "answer": answer[:300]}
            said = " ".join(answer.split())
            if self.config.mode == "yesno":
                score = parse_yesno(answer)
                reason = f"LLM judge {self.config.model} answered {said[:300]!r}: score {score:g}"
                results[i] = JudgeResult(score, False, detail, clip_reason(reason))
            else:
                score, n = score_parsed_answer(answer, item, self.rule_config)
                detail["n_claims"] = n
                reason = f"LLM judge {self.config.model} read {n} claims, rule F1 {score:.2f}: {said[:300]}"
                results[i] = JudgeResult(score, False, detail, clip_reason(reason))
        stats["failed"] = float(len(fallback_idx))
        stats["fallbacks"] = float(len(fallback_idx))
        if fallback_idx:
            if self.config.fallback == "rule":
                fb = RuleJudge(self.rule_config).score([items[i] for i in fallback_idx])
            else:
                fb = [JudgeResult(0.0) for _ in fallback_idx]
            for i, r in zip(fallback_idx, fb):
                reason = failures.get(keys[i], "deadline")
                why = (f"LLM judge gave no verdict ({reason}); fallback "
                       + (r.reason if self.config.fallback == "rule" else "zero: score 0"))
                results[i] = JudgeResult(r.score, True, {"judge": self.config.fallback, "fallback_reason": reason,
                                                         **dict(r.detail)}, clip_reason(why))
        return [r for r in results if r is not None]
