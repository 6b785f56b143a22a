"""Issue 19, each finding against a real ``vagent serve-env`` on loopback: what a client may not do.

1. read server files (svg_dir, vigorl data) or learn server paths;
2. make the server import a module of its choosing (gymnasium's ``module:Name`` ids);
3. exhaust memory or CPU with oversize config values (422 naming the bound, RSS flat);
4. leave an SVG render worker running after the server is SIGKILLed mid-render;
5. get a 500 for any config value;
6. hold a connection with a half-open request (header/read timeouts, per-client cap).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.service.conftest import ROOT
from vagent.envs.svg.render import cairosvg_available

SECRET = "TOP-SECRET-MARKER-4711"


def _err(r: httpx.Response, status: int, kind: str) -> str:
    assert r.status_code == status, (r.status_code, r.text[:500])
    body = r.json()
    assert body["error"] == kind, body
    return body["detail"]


def _rss(server) -> int:
    return int(server.metrics()["service/rss_bytes"])


def slow_svg(levels: int = 16) -> str:
    """An SVG within every static limit (31 <use>) whose <use> chain draws 2**levels dashed rects:
    cairosvg takes minutes on it."""
    parts = ['<g id="g0"><rect x="1" y="1" width="90" height="90" fill="red" stroke="blue" stroke-dasharray="1"/></g>']
    parts += [f'<g id="g{i}"><use href="#g{i - 1}"/><use href="#g{i - 1}" x="0.01"/></g>' for i in range(1, levels)]
    return ('<svg xmlns="http://www.w3.org/2000/svg" width="96" height="96"><defs>' + "".join(parts)
            + f'</defs><use href="#g{levels - 1}"/></svg>')


# ------------------------------------------------------------------ 1. files and paths stay on the server


def test_clients_cannot_point_envs_at_server_files_and_see_no_server_paths(start_server, tmp_path):
    secret_dir = tmp_path / "private"
    secret_dir.mkdir()
    (secret_dir / "key.svg").write_text(f'<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"><title>{SECRET}'
                                        '</title><rect width="5" height="5" fill="red"/></svg>')
    (secret_dir / "data.jsonl").write_text(json.dumps({SECRET: 1}) + "\n")
    targets = tmp_path / "operator_targets"
    targets.mkdir()
    (targets / "t0.svg").write_text('<svg xmlns="http://www.w3.org/2000/svg" width="32" height="32">'
                                    '<rect width="32" height="32" fill="white"/><circle cx="16" cy="16" r="8" fill="red"/></svg>')
    server = start_server("--envs", "svg,vigorl_search", "--env-config", f"svg.svg_dir={targets}",
                          "--env-config", "svg.renderer=pil")
    with httpx.Client(base_url=server.url, timeout=30) as c:
        seen = []
        for cfg in ({"svg_dir": str(secret_dir)}, {"svg_dir": "/nonexistent/dir"}, {"svg_dir": str(tmp_path)}):
            r = c.post("/v1/sessions", json={"env": "svg", "config": cfg, "seed": 0})
            detail = _err(r, 422, "ConfigError")
            assert "--env-config svg.svg_dir" in detail and SECRET not in r.text and str(tmp_path) not in r.text
            seen.append(detail)
        assert len(set(seen)) == 1, "the answer must not depend on whether the path exists"
        for path in (str(secret_dir / "data.jsonl"), "/etc/passwd", "/nonexistent.jsonl"):
            r = c.post("/v1/sessions", json={"env": "vigorl_search", "config": {"data": path}})
            assert "--env-config vigorl_search.data" in _err(r, 422, "ConfigError") and SECRET not in r.text
        # the operator's directory serves targets; nothing in the answers names it
        r = c.post("/v1/sessions", json={"env": "svg", "config": {"format": "no_think"}, "seed": 0})
        assert r.status_code == 200, r.text
        assert str(targets) not in r.content.decode("latin-1")
        header = json.loads(r.content[8:8 + int.from_bytes(r.content[4:8], "big")])
        assert header["reset"]["info"]["target_source"] == "t0.svg" and "svg_dir" not in header["spec"]["config"]
        sid = header["session_id"]
        for what in ("state", "system_prompt"):
            assert str(targets) not in c.get(f"/v1/sessions/{sid}/{what}").text


# ------------------------------------------------------------------ 2. no client-chosen module is imported


def test_gym_module_ids_from_clients_are_never_imported(start_server, tmp_path):
    marker = tmp_path / "imported"
    (tmp_path / "vagent_probe_mod.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    server = start_server("--envs", "gym", env={"PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"})
    with httpx.Client(base_url=server.url, timeout=30) as c:
        for env_id in ("vagent_probe_mod:Foo-v0", "vagent_probe_mod:FrozenLake-v1"):
            detail = _err(c.post("/v1/sessions", json={"env": "gym", "config": {"env_id": env_id}}), 422, "ConfigError")
            assert "allow_module_ids" in detail
        for cfg in ({"allow_module_ids": True, "env_id": "vagent_probe_mod:Foo-v0"}, {"env_kwargs": {"desc": ["SG"]}}):
            assert "--env-config" in _err(c.post("/v1/sessions", json={"env": "gym", "config": cfg}), 422, "ConfigError")
        detail = _err(c.post("/v1/sessions", json={"env": "gym", "config": {"env_id": "FrozenLak-v1"}}), 422, "ConfigError")
        assert "Did you mean 'FrozenLake-v1'" in detail
        assert c.post("/v1/sessions", json={"env": "gym", "config": {"env_id": "CliffWalking-v1", "action_names":
                      ["Up", "Right", "Down", "Left"], "render": "text"}, "seed": 0}).status_code == 200
    assert not marker.exists(), "the server imported a module named by a client"


# ------------------------------------------------------------------ 3 and 5. bounds: 422, never 500, memory flat


OVERSIZE = [
    ("frozenlake", {"image_size": 20000}, "image_size: expected 8 <= value <= 1024"),
    ("frozenlake", {"size": 2000}, "size: expected 2 <= value <= 32"),
    ("frozenlake", {"size": 33}, "size: expected 2 <= value <= 32"),
    ("frozenlake", {"size": 32, "image_size": 64}, "image_size >= 96"),  # 2-pixel cells: was PIL's ValueError, 500
    ("sokoban", {"dim_room": [34, 34]}, "dim_room: expected 4 <= value <= 24"),
    ("sokoban", {"dim_room": [2000, 6]}, "dim_room: expected 4 <= value <= 24"),
    ("sokoban", {"dim_room": [20, 20], "image_size": 40}, "image_size >= 60"),
    ("frozenlake", {"reward_success": 1e308, "reward_format": 1e308}, "|value| <= 1e+06"),
    ("frozenlake", {"reward_success": "inf"}, "finite"),
    ("sokoban", {"reward_step": -1e300}, "|value| <= 1e+06"),
    ("svg", {"image_size": 20000}, "image_size: expected 16 <= value <= 512"),
    ("svg", {"render_timeout_s": 0}, "--env-config svg.render_timeout_s"),
    ("svg", {"max_svg_chars": 10**9}, "--env-config svg.max_svg_chars"),
    ("vigorl_search", {"canvas_size": 100000}, "canvas_size: expected 64 <= value <= 2048"),
    ("navigation", {"image_size": 5000}, "image_size: expected 16 <= value <= 512"),
    ("primitive_skill", {"image_size": 5000}, "image_size: expected 16 <= value <= 512"),
    ("gym", {"image_size": 20000}, "image_size: expected 8 <= value <= 1024"),
]


def test_oversize_and_non_finite_configs_get_422_naming_the_bound_and_memory_stays_flat(server):
    with httpx.Client(base_url=server.url, timeout=60) as c:
        before = _rss(server)
        for name, cfg, bound in OVERSIZE:
            for seed in (None, 0):
                r = c.post("/v1/sessions", json={"env": name, "config": cfg, "seed": seed})
                assert bound in _err(r, 422, "ConfigError"), (name, cfg, r.text)
        # JSON's non-standard Infinity/NaN literals reach the server too (Python's json accepts them)
        body = b'{"env": "frozenlake", "config": {"reward_success": Infinity}, "seed": 0}'
        r = c.post("/v1/sessions", content=body, headers={"Content-Type": "application/json"})
        assert r.status_code == 422, r.text
        assert _rss(server) - before < 30 * 2**20, "server memory grew on rejected configs"
        assert c.get("/health").status_code == 200


def test_the_largest_accepted_values_work_end_to_end(server):
    """The bounds are usable: the largest FrozenLake and Sokoban at their smallest image play."""
    with httpx.Client(base_url=server.url, timeout=120) as c:
        for name, cfg in (("frozenlake", {"size": 32, "image_size": 96, "reward_success": 1e6}),
                          ("sokoban", {"dim_room": [24, 24], "image_size": 72, "num_boxes": 1}),
                          ("frozenlake", {"size": 32, "render": "text"})):
            r = c.post("/v1/sessions", json={"env": name, "config": {**cfg, "format": "no_think"}, "seed": 1})
            assert r.status_code == 200, (name, r.text[:300])


def test_a_reward_that_cannot_overflow_reaches_the_goal_without_500(server):
    with httpx.Client(base_url=server.url, timeout=30) as c:
        cfg = {"fixed_map": ["PG", "__"], "reward_success": 1e6, "reward_format": 1e6, "format": "no_think"}
        r = c.post("/v1/sessions", json={"env": "frozenlake", "config": cfg, "seed": 0})
        assert r.status_code == 200, r.text
        sid = json.loads(r.content[8:8 + int.from_bytes(r.content[4:8], "big")])["session_id"]
        r = c.post(f"/v1/sessions/{sid}/step", json={"response": "<answer>Right</answer>"})
        assert r.status_code == 200, r.text
        header = json.loads(r.content[8:8 + int.from_bytes(r.content[4:8], "big")])
        assert header["terminated"] and header["reward"] == 2e6


# ------------------------------------------------------------------ 4. no orphaned SVG render worker


def _children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
                if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(d.name))
            except (OSError, ValueError, IndexError):
                pass
    return out


def _alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie waiting for a reaper counts as gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _render_worker_of(pid: int, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for child in _children(pid):
            try:
                if b"render_worker" in Path(f"/proc/{child}/cmdline").read_bytes():
                    return child
            except OSError:
                pass
        time.sleep(0.05)
    raise AssertionError(f"no render worker under pid {pid} after {timeout}s")


@pytest.mark.skipif(not sys.platform.startswith("linux") or not cairosvg_available()[0], reason="needs Linux /proc and cairosvg")
def test_sigkill_of_the_server_mid_render_leaves_no_render_worker(start_server):
    server = start_server("--envs", "svg", "--env-config", "svg.render_timeout_s=120", "--env-config", "svg.renderer=cairosvg")
    with httpx.Client(base_url=server.url, timeout=30) as c:
        r = c.post("/v1/sessions", json={"env": "svg", "config": {"format": "no_think"}, "seed": 0})
        assert r.status_code == 200, r.text
        sid = json.loads(r.content[8:8 + int.from_bytes(r.content[4:8], "big")])["session_id"]
    worker = _render_worker_of(server.proc.pid, 30)  # the reset rendered the target

    def step() -> None:
        try:
            httpx.post(f"{server.url}/v1/sessions/{sid}/step", json={"response": f"<answer>{slow_svg()}</answer>"}, timeout=60)
        except httpx.TransportError:
            pass  # the server dies under it

    t = threading.Thread(target=step, daemon=True)
    t.start()
    time.sleep(1.5)  # the worker is rendering (minutes of work)
    assert _alive(worker)
    server.kill()
    deadline = time.monotonic() + 5
    while _alive(worker) and time.monotonic() < deadline:
        time.sleep(0.05)
    if _alive(worker):
        os.kill(worker, signal.SIGKILL)
        pytest.fail("the render worker outlived the SIGKILLed server")
    t.join(10)


@pytest.mark.skipif(not cairosvg_available()[0], reason="needs cairosvg")
def test_the_render_worker_enforces_its_own_time_limit():
    """A parent that never reads the answer (stuck, or gone): the worker ends the render itself."""
    proc = subprocess.Popen([sys.executable, "-m", "vagent.envs.svg.render_worker", "--parent-pid", str(os.getpid())],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=ROOT)
    try:
        head = proc.stdout.read(8)
        proc.stdout.read(sum(int.from_bytes(head[i:i + 4], "big") for i in (0, 4)))  # the ready frame
        svg = slow_svg().encode()
        meta = json.dumps({"w": 96, "h": 96, "timeout_s": 1.0}).encode()
        proc.stdin.write(len(meta).to_bytes(4, "big") + len(svg).to_bytes(4, "big") + meta + svg)
        proc.stdin.flush()
        t0 = time.monotonic()
        proc.wait(timeout=10)  # timeout_s + its grace, then it exits by itself
        assert time.monotonic() - t0 < 5 and proc.returncode != 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# ------------------------------------------------------------------ 6. slow clients cannot hold the server


def _connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    return s


def _read_until_closed(s: socket.socket) -> bytes:
    chunks = []
    while True:
        data = s.recv(65536)
        if not data:
            return b"".join(chunks)
        chunks.append(data)


def test_half_open_requests_are_dropped_within_the_timeouts(start_server):
    server = start_server("--header-timeout", "1", "--read-timeout", "1", "--max-connections-per-client", "6")
    t0 = time.monotonic()
    idle = _connect(server.port)  # connects and sends nothing
    partial = _connect(server.port)
    partial.sendall(b"POST /v1/sessions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n")  # no blank line
    body = _connect(server.port)
    body.sendall(b"POST /v1/sessions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
    answers = [_read_until_closed(s) for s in (idle, partial, body)]
    elapsed = time.monotonic() - t0
    assert elapsed < 4, f"half-open connections held for {elapsed:.1f}s past a 1s timeout"
    for a in answers:
        assert a.startswith(b"HTTP/1.1 408"), a[:200]
    assert b"--header-timeout" in answers[1] and b"--read-timeout" in answers[2]
    # a whole request on a fresh connection is served as usual, and keep-alive requests still work
    with httpx.Client(base_url=server.url, timeout=10) as c:
        for _ in range(3):
            assert c.get("/v1/envs").status_code == 200
            time.sleep(0.3)
    assert server.metrics()["service/connection_timeouts"] >= 3


def test_one_client_address_cannot_hold_more_than_its_connection_cap(start_server):
    server = start_server("--max-connections-per-client", "3", "--header-timeout", "30")
    held = [_connect(server.port) for _ in range(3)]
    try:
        time.sleep(0.2)
        extra = _connect(server.port)
        answer = _read_until_closed(extra)
        assert answer.startswith(b"HTTP/1.1 503") and b"--max-connections-per-client" in answer
        held.pop().close()
        time.sleep(0.2)
        assert httpx.get(server.url + "/health", timeout=5).status_code == 200  # a freed slot is usable
    finally:
        for s in held:
            s.close()


def test_the_h11_fallback_has_the_same_guards():
    """Without httptools uvicorn speaks h11: the same timeouts and cap (a real uvicorn on loopback)."""
    import uvicorn

    from tests.service.conftest import free_port
    from vagent.service.connections import ConnectionLimits, _h11_guarded
    from vagent.service.server import ServerConfig, create_app

    port = free_port()
    limits = ConnectionLimits(header_timeout=1.0, read_timeout=1.0, max_per_client=3)
    server = uvicorn.Server(uvicorn.Config(create_app(ServerConfig(port=port)), host="127.0.0.1", port=port,
                                           http=_h11_guarded(limits), log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        t0 = time.monotonic()
        idle, partial = _connect(port), _connect(port)
        partial.sendall(b"POST /v1/sessions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 50\r\n\r\n{")
        third = _connect(port)
        time.sleep(0.1)
        assert _read_until_closed(_connect(port)).startswith(b"HTTP/1.1 503")  # the fourth: over the cap
        answers = [_read_until_closed(s) for s in (idle, partial, third)]
        assert all(a.startswith(b"HTTP/1.1 408") for a in answers) and time.monotonic() - t0 < 4
        with httpx.Client(timeout=10) as c:
            for _ in range(2):
                assert c.get(f"http://127.0.0.1:{port}/health").status_code == 200
                time.sleep(0.3)
    finally:
        server.should_exit = True
        thread.join(10)
