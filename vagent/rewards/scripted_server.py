"""A scripted OpenAI-compatible chat server on loopback, for testing and benchmarking LLM judges.

A real HTTP server (FastAPI + uvicorn in a background thread, a real socket on 127.0.0.1)
that answers ``POST /v1/chat/completions`` from a *script*: ``script(request, attempt) ->
ScriptedReply`` where ``attempt`` counts how often the same messages were received before
(0 on the first). A reply can be an answer after a delay, an HTTP error with headers (429 with
``Retry-After``, 500, ...), or a raw non-JSON body. Every request is logged in ``log``.

    with ScriptedJudgeServer(lambda req, n: ScriptedReply(content="YES")) as server:
        judge = LLMJudge(LLMJudgeConfig(base_url=server.base_url, model="scripted"))

As a separate process (benchmarks): ``python -m vagent.rewards.scripted_server --latency 0.02``
answers YES to everything after ``latency`` seconds and prints ``PORT <n>`` once it listens.
"""



import asyncio
import hashlib
import json
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass(frozen=True)
class ScriptedReply:
    """What the server does for one request (``raw_body`` replaces the JSON body if set)."""

    content: str = "YES"
    status: int = 200
    delay_s: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)
    raw_body: str | None = None


@dataclass(frozen=True)
class LoggedRequest:
    time: float
    key: str
    attempt: int
    status: int
    description: str


Script = Callable[[dict, int], ScriptedReply]

_DESCRIPTION = re.compile(r'"""\n(.*?)\n"""', re.DOTALL)


def description_of(request: dict) -> str:
    """The description inside the judge prompt's triple quotes ("" if none)."""
    for msg in reversed(request.get("messages", [])):
        m = _DESCRIPTION.search(str(msg.get("content", "")))
        if m:
            return m.group(1)
    return ""


def always_yes(request: dict, attempt: int) -> ScriptedReply:
    return ScriptedReply(content="YES")


class ScriptedJudgeServer:
    """Serve ``script`` on a free loopback port; use as a context manager (or start/stop)."""

    def __init__(self, script: Script = always_yes, latency_s: float = 0.0) -> None:
        self.script, self.latency_s = script, latency_s
        self.log: list[LoggedRequest] = []
        self._seen: dict[str, int] = {}
        self._lock = threading.Lock()
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._stopping = False
        self.port = 0
        #: requests being answered now, and the most at once so far
        self.in_flight = 0
        self.max_in_flight = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def _app(self) -> Any:
        from fastapi import FastAPI, Request
        from fastapi.responses import JSONResponse, PlainTextResponse

        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def chat(request: Request):  # noqa: ANN202 (a real annotation: FastAPI resolves it)
            body = await request.json()
            key = hashlib.sha256(json.dumps(body.get("messages", []), sort_keys=True).encode()).hexdigest()
            with self._lock:
                attempt = self._seen.get(key, 0)
                self._seen[key] = attempt + 1
            reply = self.script(body, attempt)
            with self._lock:
                self.log.append(LoggedRequest(time.monotonic(), key, attempt, reply.status, description_of(body)))
                self.in_flight += 1
                self.max_in_flight = max(self.max_in_flight, self.in_flight)
            try:
                end = time.monotonic() + self.latency_s + reply.delay_s
                while not self._stopping and time.monotonic() < end:  # a sleep that stop() can end
                    await asyncio.sleep(min(0.05, end - time.monotonic()))
            finally:
                with self._lock:
                    self.in_flight -= 1
            if reply.raw_body is not None:
                return PlainTextResponse(reply.raw_body, status_code=reply.status, headers=reply.headers)
            if reply.status != 200:
                return JSONResponse({"error": {"message": f"scripted {reply.status}", "type": "scripted"}},
                                    status_code=reply.status, headers=reply.headers)
            return JSONResponse({
                "id": f"chatcmpl-{key[:12]}-{attempt}", "object": "chat.completion", "created": 0,
                "model": body.get("model", "scripted"),
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": reply.content}}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }, headers=reply.headers)

        return app

    def start(self) -> "ScriptedJudgeServer":
        import uvicorn

        self._stopping = False
        config = uvicorn.Config(self._app(), host="127.0.0.1", port=0, log_level="warning", lifespan="off",
                                timeout_graceful_shutdown=1, access_log=False)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="scripted-judge-server", daemon=True)
        self._thread.start()
        t0 = time.monotonic()
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() - t0 > 20:
                raise RuntimeError("the scripted judge server did not start within 20 s")
            time.sleep(0.01)
        self.port = self._server.servers[0].sockets[0].getsockname()[1]
        return self

    def stop(self) -> None:
        self._stopping = True
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._server = self._thread = None

    def attempts(self, description_substring: str) -> int:
        """How many requests carried a description containing ``description_substring``."""
        return sum(1 for r in self.log if description_substring in r.description)

    def __enter__(self) -> "ScriptedJudgeServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(description="Serve a YES-answering OpenAI-compatible chat endpoint on loopback.")
    p.add_argument("--latency", type=float, default=0.0, help="seconds before each answer (simulated model time)")
    args = p.parse_args(argv)
    server = ScriptedJudgeServer(always_yes, latency_s=args.latency).start()
    print(f"PORT {server.port}", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
