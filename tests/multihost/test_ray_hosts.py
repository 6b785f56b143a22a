"""Engine replicas on another host (issue 59): a Ray cluster across two "hosts" of the namespace
cluster (tests/multihost/cluster.py), the replicas pinned to host1 by a Ray custom resource
(``rollout.replica_resources``), the trainer on host0 (docs/distributed.md "Pinning replicas to
hosts"):

    host0$ ray start --head --node-ip-address <host0> --port PORT ...
    host1$ ray start --address <host0>:PORT --node-ip-address <host1> --resources '{"vagent_replica": 2}' ...
    host0$ RAY_ADDRESS=<host0>:PORT vagent train ... rollout.replicas=2 'rollout.replica_resources={vagent_replica: 1}'

The run ends; both replica actors (``ray::EngineReplica`` worker processes) live in host1's
namespace and none in host0's, seen while the run is live; the canary passes after the pushes;
``rollout/weights_version`` advances; and the weights crossed host1's interface. The nodes are
then stopped by ending every process in their namespaces (``ray stop`` is not used: it ends every
Ray process of the machine, whose process table the namespaces share). Also here: the config
checks of ``rollout.replica_resources`` and the start-up error of a cluster without the resource.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

import psutil
import pytest

from tests.distributed.conftest import SMALL, metrics, train_cmd
from tests.multihost import cluster as C

pytest.importorskip("ray", reason="engine replicas need the ray extra: pip install 'vagent[ray]'")

ROOT = Path(__file__).resolve().parents[2]
RAY = str(Path(sys.executable).with_name("ray"))
PORT = 6379
PINNED = "{vagent_replica: 1}"


def _env(**extra: str) -> dict[str, str]:
    """This process's environment without its RAY_ADDRESS, token auth off (as ``start_ray``), ``extra``."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    return dict(env, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", RAY_AUTH_MODE="disabled", **extra)


def _ray_start(cl: C.Cluster, host: int, temp_dir: str, log: Path, *args: str) -> None:
    """``ray start ARGS`` on ``host`` (its own address, 1 CPU, a small object store, its own temp
    dir); its daemons stay in the host's namespace. The output goes to ``log`` (a
    pipe would stay open in the daemons). Its workers run at niceness 0, as docs/distributed.md says
    to start nodes on a shared host (``RAY_worker_niceness=0 ray start ...``): at Ray's default +15 a
    replica's start beside 2 busy processes took over 120 s."""
    cmd = [RAY, "start", "--node-ip-address", cl.host(host).address, "--num-cpus", "1", "--disable-usage-stats",
           "--object-store-memory", "200000000", "--temp-dir", temp_dir, *args]
    with open(log, "wb") as out:
        code = subprocess.run(cl.exec_args(host, cmd), cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                              env=_env(RAY_worker_niceness="0"), timeout=180).returncode
    assert code == 0, f"`{' '.join(cmd)}` on host{host} failed ({code}):\n{log.read_text()[-3000:]}"


def _ray_stop(cl: C.Cluster, host: int) -> None:
    """``ray stop`` of one host's node (``ray stop`` itself would end every Ray process of the machine)."""
    C.stop_all(cl.host(host).netns)


@contextlib.contextmanager
def _ray_nodes(cl: C.Cluster, tmp_path: Path, head_resources: str | None, node_resources: str) -> Iterator[str]:
    """A Ray cluster of host0 (the head, offering ``head_resources`` if given) and host1 (offering
    ``node_resources``); yields the head's address; both nodes stopped and their temp dirs removed
    after."""
    head = f"{cl.host(0).address}:{PORT}"
    temps = [tempfile.mkdtemp(prefix="vrh-", dir="/tmp") for _ in range(2)]  # short: Ray's socket paths
    try:
        extra = ["--resources", head_resources] if head_resources else []
        _ray_start(cl, 0, temps[0], tmp_path / "ray0.log", "--head", "--port", str(PORT), "--include-dashboard=false",
                   *extra)
        _ray_start(cl, 1, temps[1], tmp_path / "ray1.log", "--address", head, "--resources", node_resources)
        yield head
    finally:
        _ray_stop(cl, 1)
        _ray_stop(cl, 0)
        for t in temps:
            shutil.rmtree(t, ignore_errors=True)


def _replica_pids(netns: str) -> set[int]:
    """The processes of ``netns`` that run a replica actor (Ray titles them ``ray::EngineReplica...``)."""
    found = set()
    for pid in C.pids(netns):
        try:
            if "EngineReplica" in " ".join(psutil.Process(pid).cmdline()):
                found.add(pid)
        except psutil.Error:
            continue
    return found


def _replica_units_used(cl: C.Cluster, head: str) -> float:
    """The ``vagent_replica`` units in use across the cluster (``ray status`` on host0; 0 when it
    does not list the resource): one per replica when every replica required one."""
    out = subprocess.run(cl.exec_args(0, [RAY, "status", "--address", head]), capture_output=True, text=True,
                         env=_env(), timeout=120).stdout
    used = re.search(r"([0-9.]+)/([0-9.]+) vagent_replica", out)
    return float(used.group(1)) if used else 0.0


def _rx_bytes(cl: C.Cluster, host: int) -> int:
    h = cl.host(host)
    return int(C.ip("netns", "exec", h.netns, "cat", f"/sys/class/net/{h.interface}/statistics/rx_bytes").stdout)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_replicas_pinned_to_host1_serve_a_run_on_host0(cluster, tmp_path, tiny_vlm_dir):
    log = tmp_path / "train.log"
    on: dict[int, set[int]] = {0: set(), 1: set()}
    units = 0.0
    t0 = time.monotonic()
    with _ray_nodes(cluster, tmp_path, None, '{"vagent_replica": 2}') as head:
        started = time.monotonic() - t0
        received = _rx_bytes(cluster, 1)
        cmd = train_cmd(None, *SMALL, "steps=2", f"out_dir={tmp_path / 'runs'}", f"model.path={tiny_vlm_dir}",
                        "model.cache_dir=UNUSED", "rollout.replicas=2", f"rollout.replica_resources={PINNED}")
        t1 = time.monotonic()
        with open(log, "wb") as out:
            run = subprocess.Popen(cluster.exec_args(0, cmd), cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                   env=_env(RAY_ADDRESS=head), start_new_session=True)
        deadline = time.monotonic() + 400
        while run.poll() is None and time.monotonic() < deadline:  # where the replicas live, while they do
            for host in on:
                on[host] |= _replica_pids(cluster.host(host).netns)
            if len(on[0] | on[1]) == 2 and units < 2:  # both started: did each take its unit?
                units = max(units, _replica_units_used(cluster, head))
            time.sleep(0.2)
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait(timeout=30)
            pytest.fail(f"the run did not end in 400 s:\n{log.read_text()[-4000:]}")
        took = time.monotonic() - t1
        received = _rx_bytes(cluster, 1) - received
    text = log.read_text()
    assert run.returncode == 0, text[-4000:]
    (out,) = list((tmp_path / "runs").iterdir())
    records = metrics(out)
    canary = [r["sync/canary_max_abs_diff"] for r in records if "sync/canary_max_abs_diff" in r]
    versions = [r.get("rollout/weights_version") for r in records]
    print(f"ray start (2 nodes): {started:.1f} s; the 2-step run: {took:.1f} s; host1 received "
          f"{received / 1e6:.1f} MB; replica pids on host0 {sorted(on[0])}, on host1 {sorted(on[1])}; "
          f"canary {canary}; weights versions {versions}; vagent_replica units used {units:g}")
    assert len(on[1]) == 2 and not on[0], f"replicas on host0: {on[0]}, on host1: {on[1]} (want 2 on host1 only)"
    assert units == 2, f"the replicas took {units:g} of host1's 2 vagent_replica units (`ray status`), not one each"
    assert len(records) == 2, records
    assert canary and max(canary) < 0.01, f"the weight canary's gaps {canary} (tolerance 0.01, float32)"
    assert None not in versions and versions[-1] > versions[0], f"rollout/weights_version {versions}: no push reached the replicas"
    weights = sum(p.stat().st_size for p in Path(tiny_vlm_dir).glob("*.safetensors"))
    assert received > 2 * weights, (f"host1 received {received} bytes, less than two copies of the weights "
                                    f"({weights} bytes): the weights did not cross the link")


def _sent_to(cl: C.Cluster, host: int) -> int:
    """Bytes the bridge sent toward ``host`` (its veth end's tx counter, in the bridge's namespace)."""
    path = f"/sys/class/net/h{cl.host(host).index}/statistics/tx_bytes"
    return int(C.ip("netns", "exec", cl.bridge_netns, "cat", path).stdout)


def _titles(netns: str) -> list[str]:
    """The titles of ``netns``'s replica actors: ``ray::EngineReplica.generate`` while one generates."""
    out = []
    for pid in C.pids(netns):
        try:
            title = psutil.Process(pid).cmdline()[0]
        except (psutil.Error, IndexError):
            continue
        if "EngineReplica" in title:
            out.append(title)
    return out


#: where the link to host1 is cut: in a rollout's generate call (a replica on each host; host1's
#: requests go to host0's replica and the run ends) or in a weight push (both replicas on host1: none
#: is left, and the run stops with the error). (head's resources, host1's resources)
CUT = {"generate": ('{"vagent_replica": 1}', '{"vagent_replica": 1}'), "push": (None, '{"vagent_replica": 2}')}


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("during", list(CUT))
def test_the_link_to_host1_cut_during_a_generate_or_a_push_ends_at_its_timeout(cluster, tmp_path, tiny_vlm_dir,
                                                                                 during):
    """The cable of host1 pulled (``ip link set h1 down`` at the bridge: nothing reaches host1, no
    connection is closed) while a replica there generates, or while a weight push to it is on the
    wire (the link capped at 4 Mbit/s by ``tc`` once the replicas answer, so the push takes seconds)."""
    # the replicas' start shares rollout.push_timeout_s: 45 s leaves it room on a busy 2-core machine (20 s did
    # not: a replica still importing its stack there stopped the run before any cut); the generate case never
    # pushes into the cut, so its start gets more
    generate_s, push_s = 10, (45 if during == "push" else 120)
    weights = sum(p.stat().st_size for p in Path(tiny_vlm_dir).glob("*.safetensors"))
    br, h1 = cluster.bridge_netns, f"h{cluster.host(1).index}"
    log = tmp_path / "train.log"
    t_cut = None
    with _ray_nodes(cluster, tmp_path, *CUT[during]) as head:
        cmd = train_cmd(None, *SMALL, "steps=2", f"out_dir={tmp_path / 'runs'}", f"model.path={tiny_vlm_dir}",
                        "model.cache_dir=UNUSED", "rollout.replicas=2", f"rollout.replica_resources={PINNED}",
                        f"rollout.generate_timeout_s={generate_s}", f"rollout.push_timeout_s={push_s}")
        try:
            with open(log, "wb") as out:
                run = subprocess.Popen(cluster.exec_args(0, cmd), cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                       env=_env(RAY_ADDRESS=head), start_new_session=True)
            generates, busy, sent0, capped = 0, False, None, False
            deadline = time.monotonic() + 400
            while run.poll() is None and time.monotonic() < deadline:
                if t_cut is None and during == "generate":  # the 2nd call seen (the 1st: version 0's canary)
                    now = any(t.endswith(".generate") for t in _titles(cluster.host(1).netns))
                    generates += now and not busy
                    busy = now
                    if generates >= 2:
                        C.ip("-n", br, "link", "set", h1, "down")
                        t_cut = time.monotonic()
                if t_cut is None and during == "push":  # step 1's checkpoint, then the push on the wire
                    if not capped and any(t.endswith(".generate") for t in _titles(cluster.host(1).netns)):
                        # the replicas answer (their start, with the initial weights, is over): the link is capped
                        # before the push of version 1, which then takes seconds (a capped start could outlast
                        # push_timeout_s on a busy machine, and the run would end before any push)
                        C.ip("netns", "exec", br, "tc", "qdisc", "add", "dev", h1, "root", "tbf", "rate", "4mbit",
                             "burst", "32kb", "latency", "2s")
                        capped = True
                    if capped and sent0 is None and list((tmp_path / "runs").glob("*/checkpoints/step_000001/state.pt")):
                        sent0 = _sent_to(cluster, 1)
                    if sent0 is not None and _sent_to(cluster, 1) - sent0 > weights // 4:
                        C.ip("-n", br, "link", "set", h1, "down")
                        t_cut = time.monotonic()
                time.sleep(0.02)
            if run.poll() is None:
                os.killpg(run.pid, signal.SIGKILL)
                run.wait(timeout=30)
                pytest.fail(f"the run did not end in 400 s:\n{log.read_text()[-4000:]}")
            ended = time.monotonic()
            left0 = _replica_pids(cluster.host(0).netns)
        finally:
            C.ip("-n", br, "link", "set", h1, "up")
            C.ip("netns", "exec", br, "tc", "qdisc", "del", "dev", h1, "root", check=False)
        # the link back: host1's replicas, killed by the run while they were cut off, must go by
        # themselves (Ray delivers the kill, or host1's node learns it was declared dead)
        t_up, left1 = time.monotonic(), _replica_pids(cluster.host(1).netns)
        while left1 and time.monotonic() - t_up < 120:
            time.sleep(0.5)
            left1 = _replica_pids(cluster.host(1).netns)
        gone_s = time.monotonic() - t_up
    text = log.read_text()
    assert t_cut is not None, f"the {during} to host1 was never seen, so the link was not cut:\n{text[-3000:]}"
    waited = ended - t_cut
    print(f"cut during {during}: the run ended {waited:.1f} s after the cut, exit {run.returncode}")
    print("\n".join(line for line in text.splitlines() if "replica" in line)[-2000:])
    print(f"host1's replica processes gone {gone_s:.1f} s after the link came back (left: {sorted(left1)})")
    assert not left0, f"replica processes of the ended run left on host0: {left0}"
    assert not left1, f"replica processes of the ended run still on host1 {gone_s:.0f} s after its link came back"
    if during == "generate":
        assert run.returncode == 0, text[-4000:]
        # the timeout caught the cut-off replica (one Ray's node health check declared dead logs `died (...)`)
        assert "did not answer generate within rollout.generate_timeout_s=10 s (stuck; killed); sending its" in text, \
            text[-3000:]
        records = metrics(next((tmp_path / "runs").iterdir()))
        assert len(records) == 2 and records[-1]["rollout/batch_tokens"] > 0, records
        assert waited < generate_s + 60, f"the run ended {waited:.0f} s after the cut (generate timeout {generate_s} s)"
    else:
        assert run.returncode == 1 and "Traceback" not in text, text[-4000:]
        assert "error: every engine replica is dead (" in text and "the weight push of version 1 reached none" in text, text[-3000:]
        assert f"did not answer the weight push (load_weights) within rollout.push_timeout_s={push_s} s" in text, \
            text[-3000:]
        assert push_s - 1 <= waited < push_s + 60, f"the run stopped {waited:.1f} s after the cut (push timeout {push_s} s)"


def test_replica_resources_are_checked_when_the_config_loads():
    from vagent.config import ConfigError
    from vagent.runconfig import load_config

    ok = load_config(None, ["rollout.replicas=2", f"rollout.replica_resources={PINNED}"])
    assert ok.rollout.replica_resources == {"vagent_replica": 1}
    assert load_config(None, ["rollout.replicas=2"]).rollout.replica_resources == {}
    bad = {"{vagent_replica: -1}": "rollout.replica_resources.vagent_replica must be a number > 0",
           "{vagent_replica: many}": "must be a number > 0, a whole number when above 1 (Ray's rule), got 'many'",
           "{vagent_replica: true}": "got True",
           "{vagent_replica: 1.5}": "got 1.5",
           "{CPU: 1}": "'CPU' is not a Ray custom resource name",
           "[vagent_replica]": "rollout.replica_resources: expected a mapping"}
    for value, says in bad.items():
        with pytest.raises(ConfigError) as err:
            load_config(None, ["rollout.replicas=2", f"rollout.replica_resources={value}"])
        assert says in str(err.value) and "\n" not in str(err.value), (value, str(err.value))
    with pytest.raises(ConfigError, match=r"rollout.replicas is 0: set rollout.replicas >= 1"):
        load_config(None, ["rollout.replicas=0", f"rollout.replica_resources={PINNED}"])


@pytest.mark.timeout(300)
def test_a_cluster_without_the_resource_is_named_at_the_start_up_deadline(tmp_path, tiny_vlm_dir, monkeypatch):
    """``vagent train`` on a local cluster (no node offers vagent_replica): the replica never starts,
    and the run stops at ``rollout.push_timeout_s`` with one error line (no traceback) that names the
    resource and how a node offers it."""
    from tests.ray_sessions import outlives

    root = tempfile.mkdtemp(prefix="vr-", dir="/tmp")  # short: Ray's socket paths must fit in 107 bytes
    monkeypatch.setenv("RAY_TMPDIR", root)  # the run's cluster in a folder of its own (env of _env())
    cmd = train_cmd(None, *SMALL, f"out_dir={tmp_path / 'runs'}", f"model.path={tiny_vlm_dir}",
                    "model.cache_dir=UNUSED", "rollout.replicas=1", f"rollout.replica_resources={PINNED}",
                    "rollout.push_timeout_s=3")
    try:
        t0 = time.monotonic()
        run = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=_env())
        stdout, stderr = run.communicate(timeout=240)
        took = time.monotonic() - t0
        left = outlives(run.pid, seconds=30)  # the run's own cluster went with it
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert not left, f"Ray processes of the failed run outlived it: {left}"
    text = stdout + stderr
    assert run.returncode == 1 and "Traceback" not in text, text[-4000:]
    (msg,) = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert msg.startswith("error: engine replica 0 was not ready within rollout.push_timeout_s=3 s"), msg
    assert ("waiting for CPUs / GPUs or the custom resources {vagent_replica: 1} of rollout.replica_resources the "
            "Ray cluster lacks: see `ray status`; a node offers them when started with `ray start --address HEAD:PORT "
            "--resources '{\"vagent_replica\": N}'`); if its start is only slow") in msg, msg
    assert msg.endswith("raise rollout.push_timeout_s") and took < 200, (msg, took)
