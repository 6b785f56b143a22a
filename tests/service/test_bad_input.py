"""Bad input gets the right 4xx with a reason, and the server keeps serving; auth; fuzzing."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.service.conftest import ROOT, TOKEN, free_port
from vagent.service import RemoteEnv, ServiceError, ServiceUnavailable
from vagent.service.protocol import decode_frames
from vagent.service.config import ServerConfig, StartupError, is_loopback, validate_config

AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def api(auth_server):
    with httpx.Client(base_url=auth_server.url, headers=AUTH, timeout=10) as c:
        yield c


def _err(r: httpx.Response, status: int, kind: str) -> str:
    assert r.status_code == status, (r.status_code, r.text)
    body = r.json()
    assert body["error"] == kind, body
    return body["detail"]


def test_token_is_required_and_checked(auth_server):
    assert httpx.get(auth_server.url + "/health").status_code == 200  # liveness needs no token
    for headers in ({}, {"Authorization": "Bearer wrong-token-000000"}, {"Authorization": TOKEN},
                    {"Authorization": f"Basic {TOKEN}"}):
        r = httpx.get(auth_server.url + "/v1/envs", headers=headers)
        assert "Bearer" in _err(r, 401, "Unauthorized") and r.headers["www-authenticate"] == "Bearer"
    assert httpx.get(auth_server.url + "/v1/envs", headers=AUTH).status_code == 200
    with pytest.raises(ServiceError, match="401 Unauthorized"):
        RemoteEnv(auth_server.url, "svc_toy", token="wrong-token-000000")
    env = RemoteEnv(auth_server.url, "svc_toy", token=TOKEN)
    env.reset(0)
    env.close()


def test_malformed_and_mistyped_requests_are_422_with_the_reason(api):
    detail = _err(api.post("/v1/sessions", content=b"{not json", headers={"Content-Type": "application/json"}),
                  422, "ValidationError")
    assert "JSON" in detail
    _err(api.post("/v1/sessions", content=b"\xff\xfe\x00garbage", headers={"Content-Type": "application/json"}),
         422, "ValidationError")
    assert "env" in _err(api.post("/v1/sessions", json={"env": 5}), 422, "ValidationError")
    assert "seed" in _err(api.post("/v1/sessions", json={"env": "svc_toy", "seed": "3"}), 422, "ValidationError")
    assert "seed" in _err(api.post("/v1/sessions", json={"env": "svc_toy", "seed": True}), 422, "ValidationError")
    assert "seed" in _err(api.post("/v1/sessions", json={"env": "svc_toy", "seed": -1}), 422, "ValidationError")
    assert "colour" in _err(api.post("/v1/sessions", json={"env": "svc_toy", "colour": 1}), 422, "ValidationError")
    assert "items" in _err(api.post("/v1/batch/step", json={"items": []}), 422, "ValidationError")
    assert "replay" in _err(api.post("/v1/sessions", json={"env": "svc_toy", "replay": ["x"]}), 422, "ValidationError")
    assert "Did you mean 'svc_toy'" in _err(api.post("/v1/sessions", json={"env": "svc_tyo"}), 422, "UnknownEnv")
    assert "Did you mean 'size'" in _err(api.post("/v1/sessions", json={"env": "svc_toy", "config": {"sise": 3}}),
                                         422, "ConfigError")
    r = api.post("/v1/sessions", json={"env": "svc_toy", "seed": 1})
    sid = decode_frames(r.content)[0]["session_id"]
    assert "response" in _err(api.post(f"/v1/sessions/{sid}/step", json={"response": 3}), 422, "ValidationError")
    assert "more than once" in _err(api.post("/v1/batch/step", json={"items": [
        {"session_id": sid, "response": "a"}, {"session_id": sid, "response": "b"}]}), 422, "ValidationError")
    api.delete(f"/v1/sessions/{sid}")


def test_huge_bodies_are_413(api):
    big = {"env": "svc_toy", "replay": ["x" * (1 << 20)]}
    assert "max-body-bytes" in _err(api.post("/v1/sessions", json=big), 413, "PayloadTooLarge")

    def chunks():  # no Content-Length: the limit is enforced while reading
        yield b'{"env": "svc_toy", "replay": ["'
        for _ in range(1100):
            yield b"y" * 1000
        yield b'"]}'

    _err(api.post("/v1/sessions", content=chunks(), headers={"Content-Type": "application/json"}), 413, "PayloadTooLarge")


def test_unknown_routes_sessions_and_methods(api):
    _err(api.get("/v1/nope"), 404, "NotFound")
    detail = _err(api.post("/v1/sessions/w0-missing/step", json={"response": "x"}), 404, "UnknownSession")
    assert "replays" in detail
    _err(api.get("/v1/sessions/w0-missing/state"), 404, "UnknownSession")
    _err(api.delete("/v1/sessions/w0-missing"), 404, "UnknownSession")
    _err(api.put("/v1/sessions"), 405, "MethodNotAllowed")
    out = decode_frames(api.post("/v1/batch/step", json={"items": [{"session_id": "w0-missing", "response": "x"}]}).content)
    assert out[0]["results"][0]["status"] == 404 and out[0]["results"][0]["error"]["error"] == "UnknownSession"


def test_server_keeps_serving_after_bad_input(auth_server, api):
    test_malformed_and_mistyped_requests_are_422_with_the_reason(api)
    test_unknown_routes_sessions_and_methods(api)
    env = RemoteEnv(auth_server.url, "frozenlake", token=TOKEN, format="no_think")
    env.reset(4)
    env.step("<answer>Left</answer>")
    env.close()
    m = auth_server.metrics(TOKEN)
    assert m["service/errors_5xx"] == 0 and m["service/errors_4xx"] > 20


def test_max_sessions_is_503_with_retry_after(start_server):
    srv = start_server("--max-sessions", "2")
    a, b = RemoteEnv(srv.url, "svc_toy"), RemoteEnv(srv.url, "svc_toy")
    r = httpx.post(srv.url + "/v1/sessions", json={"env": "svc_toy"})
    assert "at most 2 sessions" in _err(r, 503, "Busy") and r.headers["retry-after"] == "1"
    r = httpx.post(srv.url + "/v1/batch/create", json={"items": [{"env": "svc_toy"}]})
    _err(r, 503, "Busy")
    with pytest.raises(ServiceUnavailable):
        RemoteEnv(srv.url, "svc_toy", retry_timeout=0.3)
    a.close()
    c = RemoteEnv(srv.url, "svc_toy")  # room again
    assert srv.metrics()["service/admission_rejects"] >= 3
    b.close(), c.close()


def test_non_loopback_without_token_refuses_to_start(capsys):
    from vagent.cli import main

    port = free_port()
    assert main(["serve-env", "--host", "0.0.0.0", "--port", str(port)]) == 2  # the real CLI entry
    assert "refusing to listen on non-loopback host '0.0.0.0' without a token" in capsys.readouterr().err
    proc = subprocess.run([sys.executable, "-m", "vagent.service.server", "--host", "10.1.2.3", "--port", str(port)],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "without a token" in proc.stderr and "--token" in proc.stderr
    for host in ("127.0.0.1", "127.3.4.5", "::1", "[::1]", "localhost"):
        assert is_loopback(host)
    for host in ("0.0.0.0", "10.0.0.1", "::", "example.org", "192.168.1.2"):
        assert not is_loopback(host)
        with pytest.raises(StartupError, match="--token"):
            validate_config(ServerConfig(host=host))
    validate_config(ServerConfig(host="0.0.0.0", token="long-enough-token"))
    with pytest.raises(StartupError, match="at least 8"):
        validate_config(ServerConfig(token="short"))
    with pytest.raises(StartupError, match="--workers"):
        validate_config(ServerConfig(workers=0))


def test_fuzz_the_openapi_schema(auth_server, tmp_path):
    """schemathesis (bounded): malformed or random requests never get a 5xx; invalid ones a 4xx."""
    st = Path(sys.executable).with_name("schemathesis")
    cmd = [str(st) if st.exists() else shutil.which("schemathesis") or "schemathesis", "run", f"{auth_server.url}/openapi.json", "-H", f"Authorization: Bearer {TOKEN}",
           "-c", "not_a_server_error,negative_data_rejection,status_code_conformance",
           "-n", "6", "--seed", "7", "--phases", "examples,coverage,fuzzing", "-w", "1", "--no-shrink",
           "--output-truncate", "true"]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-6000:]
    assert " passed" in proc.stdout
    assert auth_server.metrics(TOKEN)["service/errors_5xx"] == 0
