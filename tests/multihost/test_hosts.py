"""vagent's multi-host commands (docs/distributed.md) across real network interfaces: 3 "hosts" made of
network namespaces on one bridge (tests/multihost/cluster.py), each with its own address, where
processes reach each other only over their veth link, never over a shared loopback.

- the cluster itself: 3 hosts, each with loopback and one interface on the bridge, no default
  route; ``scripts/netns-cluster`` makes, lists, runs in and removes one; the reaper removes the
  namespaces of a dead session;
- ``vagent train --nproc 1 --nnodes 2 --node-rank R --rdzv-endpoint <host0>:PORT`` on host0 and
  host1 (gloo over the veth, ``GLOO_SOCKET_IFNAME=eth0``): the weights after a PPO step equal a
  one-process run's within the 2-vs-1 tests' tolerance (1e-4 relative), and the step's traffic
  crossed host1's interface;
- ``vagent serve-env --token`` on host2, reached by URL from a ``vagent train`` on host0;
- host1 gone mid-run (every process in its namespace SIGKILLed, or first its cable cut at the
  bridge so that nothing reaches host0): host0's job ends within the configured collective timeout
  (``dist.timeout_s``) with the line of its failed collective; when host1's kernel closed the
  connections, that line names host1's address (gloo names the peer, not its rank).

After each test no process is left in any namespace (the ``cluster`` fixture checks).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.distributed.conftest import SMALL, checkpoint_weights, max_rel_diff, metrics, train, train_cmd
from tests.multihost import cluster as C

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "multihost-token-0123"
SCRIPT = ROOT / "scripts" / "netns-cluster"


def _env(**extra: str) -> dict[str, str]:
    return dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", **extra)


def _on(cl: C.Cluster, host: int, cmd: list[str], log: Path, **env: str) -> subprocess.Popen:
    """``cmd`` started on ``host`` (``ip netns exec``), its output in ``log``."""
    with open(log, "wb") as out:
        return subprocess.Popen(cl.exec_args(host, cmd), cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                env=_env(**env), start_new_session=True)


def _stop(*procs: subprocess.Popen, cluster: C.Cluster | None = None) -> None:
    """SIGKILL each process's group; then give what they started (a torchrun agent's workers, in
    sessions of their own, end with their parent within ~0.2 s) up to 10 s to leave ``cluster``
    (the ``cluster`` fixture fails the test on what is still there)."""
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        p.wait(timeout=30)
    deadline = time.monotonic() + 10
    while cluster is not None and C.leftover(cluster) and time.monotonic() < deadline:
        time.sleep(0.1)


def _node(cl: C.Cluster, rank: int, port: int, out: Path, model: Path, *extra: str) -> list[str]:
    """The command node ``rank`` of a 2-host job runs (docs/distributed.md), one process per host."""
    return train_cmd(1, "--nnodes", "2", "--node-rank", str(rank), "--rdzv-endpoint", f"{cl.host(0).address}:{port}",
                     *SMALL, f"out_dir={out}", f"model.path={model}", "model.cache_dir=UNUSED", *extra)


def _start_job(cl: C.Cluster, tmp: Path, model: Path, *extra: str, port: int = 29400) -> list[subprocess.Popen]:
    """Node rank 0 on host0 (it serves the rendezvous store) and node rank 1 on host1; gloo binds
    their ``eth0`` (the hostname resolves to 127.0.0.1 there, as it does here)."""
    return [_on(cl, r, _node(cl, r, port, tmp / "runs", model, *extra), tmp / f"node{r}.log",
                GLOO_SOCKET_IFNAME=cl.host(r).interface) for r in (0, 1)]


def _wait_all(cl: C.Cluster, procs: list[subprocess.Popen], limit_s: float, logs: list[Path]) -> list[int]:
    """The processes' exit codes; past ``limit_s`` they are killed and the test fails with their logs."""
    deadline = time.monotonic() + limit_s
    try:
        return [p.wait(timeout=max(1.0, deadline - time.monotonic())) for p in procs]
    except subprocess.TimeoutExpired:
        pass
    _stop(*procs, cluster=cl)
    pytest.fail(f"the job did not end in {limit_s:.0f}s:\n" + "\n".join(log.read_text()[-3000:] for log in logs))


def _tx_bytes(cl: C.Cluster, host: int) -> int:
    h = cl.host(host)
    return int(C.ip("netns", "exec", h.netns, "cat", f"/sys/class/net/{h.interface}/statistics/tx_bytes").stdout)


def _get_json(cl: C.Cluster, host: int, url: str, timeout_s: float = 5.0) -> dict:
    """GET ``url`` from ``host`` with the token (a Python one-liner in its namespace)."""
    code = ("import json, sys, urllib.request as u; "
            f"r = u.urlopen(u.Request({url!r}, headers={{'Authorization': 'Bearer {TOKEN}'}}), timeout={timeout_s}); "
            "sys.stdout.write(r.read().decode())")
    out = subprocess.run(cl.exec_args(host, [sys.executable, "-c", code]), capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise ConnectionError(out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "no answer")
    return json.loads(out.stdout)


# ---- the cluster -----------------------------------------------------------------------------------------------


def test_the_cluster_is_three_hosts_that_reach_each_other_and_nothing_else(cluster):
    root_links = C.ip("-o", "link", "show").stdout
    assert cluster.prefix not in root_links and "br0" not in root_links  # nothing added to the root namespace
    assert len(cluster.hosts) == 3 and len({h.address for h in cluster.hosts}) == 3
    for h in cluster.hosts:
        links = C.ip("-n", h.netns, "-o", "link", "show").stdout
        assert [line.split(":")[1].strip().split("@")[0] for line in links.splitlines()] == ["lo", h.interface]
        assert "state UP" in links.splitlines()[1] and "LOOPBACK,UP" in links.splitlines()[0]
        addrs = C.ip("-n", h.netns, "-o", "addr", "show").stdout
        assert f"inet {h.address}/24" in addrs and "inet6" not in addrs
        routes = [r.strip() for r in C.ip("-n", h.netns, "-4", "route", "show").stdout.strip().splitlines()]
        assert routes == [f"{cluster.subnet} dev {h.interface} proto kernel scope link src {h.address}"], routes
    server = _on(cluster, 2, [sys.executable, "-m", "http.server", "8000", "--bind", cluster.host(2).address],
                 Path(os.devnull))
    try:
        probe = ("import socket, sys\n"
                 "def reach(a, p):\n"
                 "    try: socket.create_connection((a, p), timeout=2).close(); return 'ok'\n"
                 "    except OSError as e: return type(e).__name__ + str(e.errno)\n"
                 "print(*[reach(a, int(p)) for a, p in (x.split(':') for x in sys.argv[1:])])")
        targets = [f"{cluster.host(2).address}:8000", "127.0.0.1:8000", "1.1.1.1:80"]
        for _ in range(100):  # the server starts
            got = subprocess.run(cluster.exec_args(0, [sys.executable, "-c", probe, *targets]), capture_output=True,
                                 text=True, timeout=60).stdout.split()
            if got[0] == "ok":
                break
            time.sleep(0.1)
        # host2's port over the bridge; not on host0's own loopback; nothing outside (no route)
        assert got == ["ok", "ConnectionRefusedError111", "OSError101"], got
    finally:
        _stop(server)


def test_leftover_processes_are_found_and_killed(cluster):
    sleeper = _on(cluster, 1, ["sleep", "600"], Path(os.devnull))
    try:
        assert C.leftover(cluster) == {cluster.host(1).netns: [sleeper.pid]}
        assert C.kill_all(cluster.host(1).netns) == [sleeper.pid]
        assert sleeper.wait(timeout=10) == -signal.SIGKILL and C.leftover(cluster) == {}
    finally:
        _stop(sleeper)


def test_the_reaper_removes_a_dead_sessions_namespaces_only(netns_cluster):
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = f"{C.SESSION_PREFIX}-{dead.pid}-abc123"
    live = f"{C.SESSION_PREFIX}-{os.getpid()}-abc123"
    C.up(1, prefix=stale)
    C.up(1, prefix=live)
    try:
        assert sorted(C.reap()) == sorted([f"{stale}-h0", f"{stale}-br"])
        names = C.namespaces()
        assert not any(n.startswith(stale) for n in names)
        assert f"{live}-h0" in names and all(ns in names for ns in netns_cluster.namespaces)
    finally:
        C.down(live)
        C.down(stale)


def test_the_script_makes_lists_runs_in_and_removes_a_cluster(netns_cluster):
    prefix = f"{C.SESSION_PREFIX}-{os.getpid()}-c11"

    def script(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(SCRIPT), "--prefix", prefix, *args], capture_output=True, text=True,
                              timeout=120)

    try:
        made = script("up", "2", "--subnet", "10.250.7.0/24")
        assert made.returncode == 0, made.stderr
        assert "host1  10.250.7.2" in made.stdout and "host1  10.250.7.2" in script("list").stdout
        assert "already" in script("up", "2").stderr
        ran = script("exec", "host1", "--", "ip", "-o", "-4", "addr", "show", "eth0")
        assert ran.returncode == 0 and "inet 10.250.7.2/24" in ran.stdout, ran.stderr
        wrong = script("exec", "host5", "--", "true")
        assert wrong.returncode == 1 and "no host 'host5'" in wrong.stderr
        gone = script("down")
        assert gone.returncode == 0 and "deleted 3 namespaces" in gone.stdout
        assert not any(n.startswith(prefix) for n in C.namespaces())
    finally:
        C.down(prefix)


# ---- jobs across the hosts ---------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_ppo_step_on_two_hosts_equals_one_process(cluster, tmp_path, tiny_vlm_dir):
    """`vagent train --nproc 1 --nnodes 2 --node-rank R --rdzv-endpoint host0:PORT` on host0 and host1."""
    sent_before = _tx_bytes(cluster, 1)
    t0 = time.monotonic()
    nodes = _start_job(cluster, tmp_path, tiny_vlm_dir)
    logs = [tmp_path / "node0.log", tmp_path / "node1.log"]
    codes = _wait_all(cluster, nodes, 600, logs)
    wall = time.monotonic() - t0
    text = [log.read_text() for log in logs]
    assert codes == [0, 0], "\n".join(t[-4000:] for t in text)
    sent = _tx_bytes(cluster, 1) - sent_before
    print(f"2 hosts: the job took {wall:.1f} s; host1 sent {sent / 1e6:.1f} MB over its eth0")
    assert "ranks: 2 (2 nodes x 1, torchrun)" in text[0] and "run directory:" not in text[1]
    for t in text:
        assert "Traceback" not in t and "TCPStore" not in t, t[-3000:]
    assert sent > 1_000_000, f"host1 sent only {sent} bytes over its interface: the ranks did not talk over the link"
    (two,) = list((tmp_path / "runs").iterdir())

    one = train(tmp_path, tiny_vlm_dir, None, "one")
    names = sorted(p.name for p in (one / "checkpoints").iterdir() if not p.name.startswith("."))
    assert names == ["step_000001"] == sorted(p.name for p in (two / "checkpoints").iterdir()
                                              if not p.name.startswith("."))
    diff = max_rel_diff(checkpoint_weights(one / "checkpoints" / names[0]),
                        checkpoint_weights(two / "checkpoints" / names[0]))
    print(f"2 hosts vs 1 process: the weights after the step differ by {diff:.2e} relative")
    assert diff < 1e-4, f"the 2-host step differs from the one-process step by {diff:.2e} relative"
    m1, m2 = metrics(one), metrics(two)
    for k in ("rollout/batch_tokens", "rollout/sampled_tokens", "reward/mean"):
        assert m1[-1].get(k) == m2[-1].get(k), (k, m1[-1].get(k), m2[-1].get(k))
    assert m1[-1]["actor/grad_norm"] > 0 and m2[-1]["actor/grad_norm"] == pytest.approx(m1[-1]["actor/grad_norm"],
                                                                                        rel=1e-3)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_an_env_server_on_host2_serves_a_run_on_host0(cluster, tmp_path, tiny_vlm_dir):
    """`vagent serve-env --host <host2> --token T` on host2; `vagent train envs.0.urls=[http://<host2>:8000]`
    with VAGENT_SERVICE_TOKEN on host0."""
    url = f"http://{cluster.host(2).address}:8000"
    server = _on(cluster, 2, [sys.executable, "-m", "vagent", "serve-env", "--host", cluster.host(2).address,
                              "--port", "8000", "--token", TOKEN, "--envs", "frozenlake"], tmp_path / "server.log")
    try:
        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None, (tmp_path / "server.log").read_text()[-3000:]
            try:
                _get_json(cluster, 0, url + "/health", timeout_s=2)
                break
            except ConnectionError as exc:
                assert time.monotonic() < deadline, f"{url} not reachable from host0 after 120 s: {exc}"
                time.sleep(0.5)
        run = _on(cluster, 0, train_cmd(None, *SMALL, f"out_dir={tmp_path / 'runs'}", f"model.path={tiny_vlm_dir}",
                                        "model.cache_dir=UNUSED", f"envs.0.urls=[{url}]"),
                  tmp_path / "train.log", VAGENT_SERVICE_TOKEN=TOKEN)
        code = _wait_all(cluster, [run], 400, [tmp_path / "train.log"])[0]
        log = (tmp_path / "train.log").read_text()
        assert code == 0, log[-4000:]
        assert f"envs.0 (frozenlake) at {url}: ok (token sent)" in log, log[-3000:]
        served = _get_json(cluster, 0, url + "/metrics")
        assert served["service/sessions_created"] >= 4 and served["service/steps"] >= 4, served
        (out,) = list((tmp_path / "runs").iterdir())
        assert metrics(out)[-1]["rollout/batch_tokens"] > 0
    finally:
        if server.poll() is None:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                _stop(server, cluster=cluster)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_host1_gone_mid_run_stops_host0_within_the_collective_timeout(cluster, tmp_path, tiny_vlm_dir):
    """Host1 loses power mid-run: its cable is cut at the bridge, then its processes killed, so nothing
    reaches host0, which waits for dist.timeout_s and then names the ranks on other hosts. (Host1's
    processes killed with the cable up, heard at once: tests/multihost/test_host_jobs.py's lost host.)"""
    timeout_s = 15
    nodes = _start_job(cluster, tmp_path, tiny_vlm_dir, "steps=2", f"dist.timeout_s={timeout_s}")
    logs = [tmp_path / "node0.log", tmp_path / "node1.log"]
    cable = ("-n", cluster.bridge_netns, "link", "set", f"h{cluster.host(1).index}")
    try:
        deadline = time.monotonic() + 400
        while not list((tmp_path / "runs").glob("*/checkpoints/step_000001/state.pt")):
            assert nodes[0].poll() is None, logs[0].read_text()[-4000:]
            assert time.monotonic() < deadline, "no checkpoint after 400 s"
            time.sleep(0.05)
        C.ip(*cable, "down")
        killed = C.kill_all(cluster.host(1).netns)
        t0 = time.monotonic()
        code = _wait_all(cluster, nodes[:1], timeout_s + 120, logs[:1])[0]
        waited = time.monotonic() - t0
    finally:
        _stop(*nodes, cluster=cluster)
        C.ip(*cable, "up")
    text = logs[0].read_text()
    print(f"cable cut, host1's {len(killed)} processes killed; host0's job ended {waited:.1f} s later")
    print("\n".join(line for line in text.splitlines() if "error" in line.lower())[-3000:])
    assert code == 1, text[-4000:]
    assert "rank 0/2: collective '" in text and f"dist.timeout_s={timeout_s}s" in text, text[-4000:]
    assert "error: the torchrun job failed: rank 0 exited with status 1" in text, text[-4000:]
    assert "--nnodes 2 --node-rank R --rdzv-endpoint" in text, text[-2000:]  # the resume of a job of 2 hosts
    assert "(the newest: step_00000" in text, text[-2000:]
    assert timeout_s - 1 <= waited < timeout_s + 60, \
        f"host0 stopped {waited:.1f} s after host1 was gone, not at dist.timeout_s={timeout_s}"
    assert f"the ranks on other hosts: rank 1 (host {cluster.host(1).address})" in text, text[-4000:]
