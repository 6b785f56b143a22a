"""A total deadline per API request, and one line per unreadable answer.

A real loopback HTTP server (a plain socket server: it must misbehave below the HTTP layer) that
answers each request with headers and then one byte every 0.2 s of a 500-byte body (100 s of
drip), or drips the headers themselves, or sends a complete answer the SDK cannot read. Each
of the three adapters, through its official SDK, must give up within its ``timeout_s`` of 1 s
as a timeout (httpx's per-read timeout alone lets the drip run for the full 100 s), and an
unreadable answer is one warning line per episode, without a traceback.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time

import pytest

from tests.eval.test_backends import SAMPLING, _conv
from vagent.eval.backends import make_policy
from vagent.eval.config import ModelSpec

DRIP_S, BODY = 0.2, 500  # without a total deadline a request lasts BODY * DRIP_S = 100 s


class MisbehavingServer:
    """``mode``: "body" (headers, then the body one byte at a time), "headers" (the status line, then
    the headers one byte at a time) or "malformed" (a complete 200 answer whose JSON the SDKs cannot
    read as a reply). ``dripped``: bytes dripped per connection; ``finished``: drips that ran to the end."""

    def __init__(self, mode: str):
        self.mode, self.dripped, self.finished = mode, [], 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self._stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        self.sock.settimeout(0.2)
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _read_request(self, conn: socket.socket) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            data += conn.recv(65536)
        head, body = data.split(b"\r\n\r\n", 1)
        length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        while len(body) < length:
            body += conn.recv(65536)

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                self._read_request(conn)
                if self.mode == "malformed":
                    body = json.dumps({"id": "x", "object": "chat.completion", "model": "m", "created": 0,
                                       "choices": [{"index": 0, "message": 5, "finish_reason": "stop"}]}).encode()
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                                 + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)
                    return
                if self.mode == "body":
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                                 + str(BODY).encode() + b"\r\n\r\n")
                    drip = b" " * BODY
                else:
                    conn.sendall(b"HTTP/1.1 200 OK\r\n")
                    drip = b"X-Slow: " + b"a" * BODY
                n = 0
                self.dripped.append(0)
                for n in range(len(drip)):
                    conn.sendall(drip[n:n + 1])
                    self.dripped[-1] = n + 1
                    if self._stop.wait(DRIP_S):
                        return
                self.finished += 1
            except OSError:  # the client gave up and closed the connection
                return

    def close(self) -> None:
        self._stop.set()
        self.sock.close()


def _policy(url: str, api: str, monkeypatch, **kw):
    monkeypatch.setenv("EVAL_TEST_KEY", "test-key")
    spec = ModelSpec(backend=api, model="m", base_url=url + "/v1" if api == "openai" else url,
                     api_key_env="EVAL_TEST_KEY", max_retries=0, **kw)
    return make_policy(spec)


@pytest.mark.parametrize("api,mode", [("openai", "body"), ("anthropic", "body"), ("gemini", "body"),
                                      ("openai", "headers")])
def test_a_dripping_server_fails_the_request_at_timeout_s(api, mode, monkeypatch):
    server = MisbehavingServer(mode)
    policy = _policy(server.url, api, monkeypatch, timeout_s=1.0)
    try:
        t0 = time.monotonic()
        (reply,) = policy.act([_conv()], SAMPLING)
        elapsed = time.monotonic() - t0
    finally:
        policy.close()
        server.close()
    assert reply.finish_reason == "error" and "timeout" in reply.error, reply.error
    assert policy.stats.timeouts == 1
    # the drip was cut: the server was still dripping (100 s in all) when the client left
    assert server.finished == 0 and 0 < server.dripped[0] < BODY // 2, server.dripped
    assert 0.9 <= elapsed < 30, elapsed  # ended at the 1 s deadline, give or take the machine's load


def test_unreadable_answers_are_one_line_each(monkeypatch, caplog):
    server = MisbehavingServer("malformed")
    policy = _policy(server.url, "openai", monkeypatch, timeout_s=10.0)
    try:
        with caplog.at_level(logging.INFO, logger="vagent"):
            replies = policy.act([_conv(), _conv("Current observation: again")], SAMPLING)
    finally:
        policy.close()
        server.close()
    assert all(r.finish_reason == "error" and "unreadable answer" in r.error for r in replies), replies
    assert all("\n" not in r.error for r in replies)
    warned = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warned) == 2, [r.getMessage() for r in warned]  # one per episode
    for rec in warned:
        assert rec.exc_info is None and "\n" not in rec.getMessage(), rec.getMessage()
        assert "bad_response" in rec.getMessage() and "unreadable answer" in rec.getMessage()
