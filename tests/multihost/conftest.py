"""The multi-host tests' cluster: 3 "hosts" (network namespaces on one bridge, tests/multihost/cluster.py)
made once per session and torn down at its end, even when a test fails.

- ``netns_cluster`` (session): skipped, with the reason, where namespaces cannot be made (not root,
  no CAP_NET_ADMIN); first removes the namespaces of earlier sessions whose process is gone
  (:func:`cluster.reap`: a session killed with SIGKILL runs no finalizer).
- ``cluster`` (each test): the session's cluster; after the test no process may be left in any of
  its namespaces: what is left is killed and the test fails, naming the processes.
"""

from __future__ import annotations

from typing import Iterator

import psutil
import pytest

from tests.distributed.conftest import tiny_vlm_dir  # noqa: F401 - the distributed tests' tiny VLM fixture
from tests.multihost import cluster as C


@pytest.fixture(scope="session")
def netns_cluster() -> Iterator[C.Cluster]:
    why = C.unavailable()
    if why:
        pytest.skip(why)
    reaped = C.reap()
    if reaped:
        print(f"removed {len(reaped)} namespaces of dead test sessions: {', '.join(reaped)}")
    cl = C.up(3)
    try:
        yield cl
    finally:
        C.down(cl)


def _describe(pid: int) -> str:
    try:
        return f"{pid} ({' '.join(psutil.Process(pid).cmdline())[:120]})"
    except psutil.Error:
        return str(pid)


@pytest.fixture
def cluster(netns_cluster: C.Cluster) -> Iterator[C.Cluster]:
    yield netns_cluster
    left = C.leftover(netns_cluster)
    if left:
        seen = {ns: [_describe(p) for p in pids] for ns, pids in left.items()}
        for ns in left:
            C.kill_all(ns)
        pytest.fail(f"processes were left in the cluster's namespaces after the test (now killed): {seen}",
                    pytrace=False)

