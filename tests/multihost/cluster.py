"""A cluster of network namespaces on this machine: N "hosts" joined by one bridge, each with its own
interface and address, where processes reach each other only over that link.

    cluster = up(3)                       # hosts host0..host2 at 10.A.B.1..3/24 (A.B picked at random)
    subprocess.run(cluster.exec_args(0, ["python", "-m", "vagent", "train", ...]))
    leftover(cluster)                     # {namespace: [pids]} of processes still in it
    down(cluster.prefix)                  # kill every process in them, delete the namespaces

Layout (``ip`` commands only, no other tool; needs root or CAP_NET_ADMIN + CAP_SYS_ADMIN):

- namespace ``<prefix>-br`` holds the bridge ``br0`` and one veth end ``h<i>`` per host, so the
  root namespace gets no new link;
- namespace ``<prefix>-h<i>`` ("host i") holds the other end, named ``eth0``, with the address
  ``<net>.<i + 1>/24``, and ``lo``, both up; IPv6 is off. Its only route is the /24: no default
  route, nothing outside the cluster is reachable.

The namespaces share this machine's filesystem, users, hostname and process table (``ip netns
exec`` changes the network only): a run directory written in one "host" is seen by the others,
like a shared filesystem. The hostname resolves to 127.0.0.1 in every host, as on many real
machines, so a program that finds its address from the hostname finds the loopback.

Names: ``vagentmh-<pid>-<hex>`` for a test session (``<pid>`` its process: :func:`reap` removes
the namespaces of sessions whose process is gone), ``vagentcl`` for ``scripts/netns-cluster``.
This module uses the standard library only (``scripts/netns-cluster`` imports it without vagent).
"""

from __future__ import annotations

import ipaddress
import os
import random
import re
import secrets
import signal
import subprocess
import time
from dataclasses import dataclass
from typing import Sequence

#: the prefix of a test session's namespaces: vagentmh-<pid>-<hex>
SESSION_PREFIX = "vagentmh"
#: the prefix of the namespaces scripts/netns-cluster makes
CLI_PREFIX = "vagentcl"
#: each host's interface on the bridge
INTERFACE = "eth0"
_SESSION_RE = re.compile(rf"^{SESSION_PREFIX}-(\d+)-[0-9a-f]+-")


class ClusterError(RuntimeError):
    """An ``ip`` command failed; the message has the command and its error."""


@dataclass(frozen=True)
class Host:
    """One "host": a network namespace with one interface on the cluster's bridge."""

    index: int
    #: the network namespace (``ip netns exec <netns> ...``)
    netns: str
    #: its IPv4 address on the bridge
    address: str
    #: its interface on the bridge (the value for GLOO_SOCKET_IFNAME)
    interface: str = INTERFACE

    @property
    def name(self) -> str:
        return f"host{self.index}"


@dataclass(frozen=True)
class Cluster:
    """The hosts of one :func:`up`, their bridge's namespace and their /24."""

    prefix: str
    subnet: str
    bridge_netns: str
    hosts: tuple[Host, ...]

    @property
    def namespaces(self) -> list[str]:
        return [h.netns for h in self.hosts] + [self.bridge_netns]

    def host(self, which: int | str) -> Host:
        """A host by index (0) or name (``host0``)."""
        for h in self.hosts:
            if which in (h.index, h.name):
                return h
        names = ", ".join(h.name for h in self.hosts)
        raise KeyError(f"no host {which!r} in the cluster {self.prefix}: it has {names}")

    def exec_args(self, which: int | str, cmd: Sequence[str]) -> list[str]:
        """``ip netns exec <host's namespace> CMD``: the command line that runs ``cmd`` on a host."""
        return ["ip", "netns", "exec", self.host(which).netns, *cmd]


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run ``ip ARGS``; ClusterError with the command and its stderr when it fails (``check``)."""
    try:
        out = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    except FileNotFoundError as exc:
        raise ClusterError("the `ip` command (iproute2) is not installed: apt-get install iproute2") from exc
    if check and out.returncode != 0:
        raise ClusterError(f"`ip {' '.join(args)}` failed ({out.returncode}): {out.stderr.strip()}")
    return out


def namespaces() -> list[str]:
    """The names of every network namespace that ``ip netns`` knows."""
    return [line.split()[0] for line in ip("netns", "list").stdout.splitlines() if line.strip()]


def unavailable() -> str | None:
    """Why namespaces cannot be made here (None when they can): a probe namespace is made and
    deleted, so a missing capability or a sandbox that forbids ``mount`` is found, not guessed."""
    probe = f"{SESSION_PREFIX}-{os.getpid()}-{secrets.token_hex(2)}-probe"
    try:
        ip("netns", "add", probe)
    except ClusterError as exc:
        return f"network namespaces are not permitted here ({exc}); run as root or with CAP_NET_ADMIN and CAP_SYS_ADMIN"
    ip("netns", "del", probe, check=False)
    return None


def session_prefix() -> str:
    """A prefix no other session uses: ``vagentmh-<this pid>-<random hex>``."""
    return f"{SESSION_PREFIX}-{os.getpid()}-{secrets.token_hex(3)}"


def pick_subnet(rng: random.Random | None = None) -> str:
    """A random private /24 under 10.0.0.0/8 that no address of this (root) namespace overlaps."""
    rng = rng or random.Random()
    taken = [ipaddress.ip_interface(w).network for line in ip("-o", "-4", "addr", "show").stdout.splitlines()
             for w in line.split()[3:4]]
    for _ in range(100):
        net = ipaddress.ip_network(f"10.{rng.randint(16, 254)}.{rng.randint(0, 255)}.0/24")
        if not any(net.overlaps(t) for t in taken):
            return str(net)
    raise ClusterError(f"no free 10.x.y.0/24 beside this machine's addresses {taken}")


def up(n: int = 3, prefix: str | None = None, subnet: str | None = None) -> Cluster:
    """Make ``n`` hosts on one bridge (see the module docstring); on any failure, delete what was
    made and raise ClusterError."""
    if not 1 <= n <= 200:
        raise ValueError(f"a cluster has 1..200 hosts, got {n}")
    prefix = prefix or session_prefix()
    net = ipaddress.ip_network(subnet or pick_subnet())
    if net.prefixlen != 24:
        raise ValueError(f"the cluster's subnet must be a /24, got {net}")
    existing = [ns for ns in namespaces() if ns.startswith(prefix + "-")]
    if existing:
        raise ClusterError(f"namespaces of a cluster {prefix!r} exist already ({', '.join(existing)}): "
                           f"remove them first (scripts/netns-cluster --prefix {prefix} down)")
    hosts = tuple(Host(i, f"{prefix}-h{i}", str(net.network_address + i + 1)) for i in range(n))
    cluster = Cluster(prefix, str(net), f"{prefix}-br", hosts)
    try:
        _build(cluster)
    except BaseException:
        down(prefix)
        raise
    return cluster


def _build(cluster: Cluster) -> None:
    br = cluster.bridge_netns
    ip("netns", "add", br)
    ip("-n", br, "link", "add", "br0", "type", "bridge")
    ip("-n", br, "link", "set", "br0", "up")
    prefixlen = ipaddress.ip_network(cluster.subnet).prefixlen
    for h in cluster.hosts:
        ip("netns", "add", h.netns)
        ip("-n", h.netns, "link", "set", "lo", "up")
        # the veth pair is born in the bridge's namespace with its peer moved into the host's
        ip("-n", br, "link", "add", f"h{h.index}", "type", "veth", "peer", "name", h.interface, "netns", h.netns)
        ip("-n", br, "link", "set", f"h{h.index}", "master", "br0", "up")
        for conf in ("all", "default", h.interface):  # one IPv4 address per host and nothing else
            ip("netns", "exec", h.netns, "sysctl", "-q", "-w", f"net.ipv6.conf.{conf}.disable_ipv6=1")
        ip("-n", h.netns, "addr", "add", f"{h.address}/{prefixlen}", "dev", h.interface)
        ip("-n", h.netns, "link", "set", h.interface, "up")


def pids(netns: str) -> list[int]:
    """The processes whose network namespace is ``netns`` (``ip netns pids``; [] when it is gone)."""
    out = ip("netns", "pids", netns, check=False)
    return [int(p) for p in out.stdout.split() if p.isdigit()]


def leftover(cluster_or_prefix: Cluster | str) -> dict[str, list[int]]:
    """``{namespace: pids}`` of the cluster's namespaces that still hold a process."""
    names = _names(cluster_or_prefix)
    return {ns: p for ns in names if (p := pids(ns))}


def kill_all(netns: str, timeout_s: float = 10.0) -> list[int]:
    """SIGKILL every process in ``netns`` until none is left (a process may fork while it is
    killed); returns the pids killed. ClusterError when some survive ``timeout_s`` (e.g. a process
    in uninterruptible sleep)."""
    killed: list[int] = []
    deadline = time.monotonic() + timeout_s
    while found := pids(netns):
        if time.monotonic() > deadline:
            raise ClusterError(f"processes {found} in the namespace {netns} survive SIGKILL after {timeout_s:g}s")
        for pid in found:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except ProcessLookupError:
                pass
        time.sleep(0.05)
    return sorted(set(killed))


def stop_all(netns: str, grace_s: float = 10.0) -> list[int]:
    """SIGTERM every process in ``netns`` (as ``ray stop`` does to a node, but to this host only:
    the namespaces share one process table), then SIGKILL what is left after ``grace_s``; returns
    the pids killed."""
    for pid in pids(netns):
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace_s
    while pids(netns) and time.monotonic() < deadline:
        time.sleep(0.1)
    return kill_all(netns)


def down(cluster_or_prefix: Cluster | str) -> list[str]:
    """Kill every process in the cluster's namespaces and delete them (their veths and bridge go
    with them); returns the namespaces deleted. Safe to call twice or on a half-made cluster."""
    names = _names(cluster_or_prefix)
    for ns in names:
        kill_all(ns)
    for ns in names:
        ip("netns", "del", ns, check=False)
    left = set(names) & set(namespaces())
    if left:
        raise ClusterError(f"could not delete the namespaces {sorted(left)}: `ip netns del NAME` says why")
    return names


def _names(cluster_or_prefix: Cluster | str) -> list[str]:
    known = namespaces()
    if isinstance(cluster_or_prefix, Cluster):
        return [ns for ns in cluster_or_prefix.namespaces if ns in known]
    return [ns for ns in known if ns.startswith(cluster_or_prefix + "-")]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def reap() -> list[str]:
    """Delete the namespaces of test sessions whose process is gone (``vagentmh-<pid>-...`` with no
    process ``<pid>``), killing what runs in them; returns the namespaces deleted."""
    matches = [m for ns in namespaces() if (m := _SESSION_RE.match(ns))]
    dead = sorted({m.group(0)[:-1] for m in matches if not _alive(int(m.group(1)))})
    return [ns for prefix in dead for ns in down(prefix)]


def read_cluster(prefix: str) -> Cluster:
    """The cluster whose namespaces start with ``prefix`` (made by :func:`up`, maybe by another
    process), from ``ip``: its hosts in order, their addresses."""
    hosts = []
    for ns in namespaces():
        m = re.fullmatch(re.escape(prefix) + r"-h(\d+)", ns)
        if m:
            addr = ip("-n", ns, "-o", "-4", "addr", "show", "dev", INTERFACE).stdout.split()
            cidr = addr[3] if len(addr) > 3 else ""
            hosts.append((int(m.group(1)), ns, cidr))
    if not hosts:
        raise ClusterError(f"no cluster {prefix!r}: no namespace {prefix}-h0 "
                           "(make one with scripts/netns-cluster up N)")
    hosts.sort()
    subnet = str(ipaddress.ip_interface(hosts[0][2]).network) if hosts[0][2] else ""
    return Cluster(prefix, subnet, f"{prefix}-br",
                   tuple(Host(i, ns, cidr.split("/")[0]) for i, ns, cidr in hosts))
