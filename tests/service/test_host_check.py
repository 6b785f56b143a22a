"""The tokenless env server answers only requests addressed to a loopback name (issue 47, item 9):
a request whose Host is another name (a web page's, after DNS rebinding) gets a JSON 403; a server
with a token answers any Host (the token guards it)."""

from __future__ import annotations

import httpx


def test_tokenless_server_refuses_a_foreign_host(server):
    for host in ("127.0.0.1", "localhost", f"localhost:{server.port}", "[::1]"):
        assert httpx.get(server.url + "/health", headers={"Host": host}, timeout=5).status_code == 200, host
    r = httpx.get(server.url + "/health", headers={"Host": "attacker.example:80"}, timeout=5)
    assert r.status_code == 403
    assert r.json()["error"] == "Forbidden" and "DNS rebinding" in r.json()["detail"]


def test_server_with_a_token_answers_any_host(auth_server):
    r = httpx.get(auth_server.url + "/health", headers={"Host": "envs.example"}, timeout=5)
    assert r.status_code == 200
