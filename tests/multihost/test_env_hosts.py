"""Env servers on other hosts that go away (issue 59): ``vagent serve-env`` on host1 and host2 of the
namespace cluster, a run on host0 with ``envs.0.urls`` naming them, and host2's link cut mid-run
(``ip link set h2 down`` at the bridge: no connection is closed, requests simply go unanswered).

- two servers: each request to host2 misses ``envs.0.timeout_s``; its sessions are restored on
  host1 by replaying their episodes, the run ends normally and counts the replays
  (``rollout/env_replays``);
- host2 alone: the run stops within ``envs.0.timeout_s`` x 3 + ``envs.0.retry_timeout_s`` (plus
  slack) with one error line naming the server, exit status 1.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from tests.distributed.conftest import SMALL, metrics, train_cmd
from tests.multihost import cluster as C
from tests.multihost.test_hosts import TOKEN, _get_json, _on, _stop, _wait_all

#: seconds per env request and per env call's retries across the servers in these runs
TIMEOUT_S, RETRY_S = 3, 10


def _serve(cl: C.Cluster, host: int, log) -> tuple[subprocess.Popen, str]:
    """``vagent serve-env`` on ``host`` with the token; returns it and its URL once host0 reaches it."""
    url = f"http://{cl.host(host).address}:8000"
    server = _on(cl, host, [sys.executable, "-m", "vagent", "serve-env", "--host", cl.host(host).address, "--port",
                            "8000", "--token", TOKEN, "--envs", "frozenlake"], log)
    deadline = time.monotonic() + 120
    while True:
        assert server.poll() is None, log.read_text()[-3000:]
        try:
            _get_json(cl, 0, url + "/health", timeout_s=2)
            return server, url
        except ConnectionError as exc:
            assert time.monotonic() < deadline, f"{url} not reachable from host0 after 120 s: {exc}"
            time.sleep(0.5)


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("servers", [2, 1], ids=["host1-takes-over", "no-server-left"])
def test_the_env_host_cut_off_mid_run_moves_its_episodes_or_stops_naming_it(cluster, tmp_path, tiny_vlm_dir,
                                                                               servers):
    br, h2 = cluster.bridge_netns, f"h{cluster.host(2).index}"
    procs: list[subprocess.Popen] = []
    t_cut = ended = None
    try:
        first, url2 = _serve(cluster, 2, tmp_path / "server2.log")
        procs.append(first)
        urls = [url2]
        if servers == 2:
            second, url1 = _serve(cluster, 1, tmp_path / "server1.log")
            procs.append(second)
            urls.append(url1)
        # every episode is mid-way when host2 has stepped it once, however fast this machine is or
        # whatever the policy replies: no holes and a goal 6 moves away (a reply moves at most 5), 3
        # turns, and 2 s after each env step (the latency wrapper, in the training process) before the
        # next: the cut lands while host2 holds episodes with turns to go
        run = _on(cluster, 0, train_cmd(None, *SMALL, "steps=2", "rollout.max_turns=3", f"out_dir={tmp_path / 'runs'}",
                                        f"model.path={tiny_vlm_dir}", "model.cache_dir=UNUSED",
                                        f"envs.0.urls=[{','.join(urls)}]", f"envs.0.timeout_s={TIMEOUT_S}",
                                        f"envs.0.retry_timeout_s={RETRY_S}",
                                        "envs.0.config.fixed_map=[P___,____,____,___G]",
                                        "envs.0.latency={dist: lognormal, median_s: 2.0, sigma: 0.01, max_s: 3.0}"),
                  tmp_path / "train.log", VAGENT_SERVICE_TOKEN=TOKEN)
        procs.append(run)
        deadline = time.monotonic() + 400
        while run.poll() is None and time.monotonic() < deadline:  # host2 has stepped an episode: cut it off
            if _get_json(cluster, 0, url2 + "/metrics").get("service/steps", 0) >= 1:
                C.ip("-n", br, "link", "set", h2, "down")
                t_cut = time.monotonic()
                break
            time.sleep(0.05)
        code = _wait_all(cluster, [run], 400, [tmp_path / "train.log"])[0]
        ended = time.monotonic()
        served1 = _get_json(cluster, 0, urls[1] + "/metrics") if servers == 2 else {}
    finally:
        C.ip("-n", br, "link", "set", h2, "up")
        for p in procs[:-1]:  # the servers: SIGTERM, as an operator stops them
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs[:-1]:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        _stop(*procs, cluster=cluster)
    log = (tmp_path / "train.log").read_text()
    assert t_cut is not None, f"host2's server never stepped 2 env steps before the run ended:\n{log[-3000:]}"
    waited = ended - t_cut
    print(f"{servers} server(s): the run ended {waited:.1f} s after host2 was cut off, exit {code}")
    print("\n".join(line for line in log.splitlines() if "warning" in line or "error" in line)[-2000:])
    if servers == 2:
        assert code == 0, log[-4000:]
        records = metrics(next((tmp_path / "runs").iterdir()))
        replays = sum(r.get("rollout/env_replays", 0) for r in records)
        assert len(records) == 2 and replays >= 1, [{k: r.get(k) for k in ("rollout/env_replays",
                                                                          "rollout/errors")} for r in records]
        assert all(r["rollout/errors"] == 0 for r in records), "an episode was lost when its env host went"
        assert "env session(s) were restored by replay on a live env server" in log, log[-3000:]
        assert served1.get("service/sessions_created", 0) >= 1, served1
        # moved within the deadlines (3 tries of timeout_s), not the OS's connect timeout (~2 min)
        assert waited < 3 * TIMEOUT_S + 60, f"the run ended {waited:.0f} s after the cut"
    else:
        assert code == 1 and "Traceback" not in log, log[-4000:]
        (line,) = [ln for ln in log.splitlines() if ln.startswith("error:")]
        assert url2 in line and f"no env server answered within {float(RETRY_S)}s" in line, line
        assert waited < 3 * TIMEOUT_S + RETRY_S + 60, f"the run stopped {waited:.0f} s after the cut"
