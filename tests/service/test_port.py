"""``--port``: a port outside 0..65535 is refused in one line (it used to wrap: 70000 listened on
4464 while the banner said 70000); 0 listens on a free port and the banner names it; a port in use
is one line too."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time

import httpx
import pytest

from tests.service.conftest import ROOT
from vagent.service.config import ServerConfig, StartupError, validate_config


def test_ports_outside_the_tcp_range_are_refused(capsys):
    from vagent.cli import main

    for port in (70000, 65536, -1):
        with pytest.raises(StartupError, match=rf"--port must be in 1\.\.65535 \(or 0: any free port\), got {port}"):
            validate_config(ServerConfig(port=port))
    assert main(["serve-env", "--port", "70000"]) == 2  # the real CLI entry, before any import of the server
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["vagent serve-env: error: --port must be in 1..65535 (or 0: any free port), got 70000"]


def _start(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "vagent.service.server", *args], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_port_0_listens_on_a_free_port_and_says_which():
    proc = _start("--port", "0", "--envs", "frozenlake")
    try:
        line = proc.stdout.readline()
        m = re.search(r"http://127\.0\.0\.1:(\d+) ", line)
        assert m, line
        port = int(m.group(1))
        assert port != 0
        deadline = time.monotonic() + 20
        while True:
            try:
                assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).json()["status"] == "ok"
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, proc.stderr.read() if proc.poll() is not None else "not ready"
                time.sleep(0.05)
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_a_port_in_use_is_one_line():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        proc = _start("--port", str(port))
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2, (out, err)
    assert err.strip().splitlines() == [
        f"vagent serve-env: error: cannot listen on 127.0.0.1:{port}: address already in use; "
        "pick another --port (or 0: any free port) or stop the process that holds it."]
