"""The tokenless env server answers only requests addressed to a loopback name (issue 47, item 9):
a request whose Host is another name (a web page's, after DNS rebinding) gets a JSON 403; a server
with a token answers any Host (the token guards it). The Host is read as an RFC 3986 authority, so a
loopback name with anything after it but a port is another name (issue 55, item 8)."""

from __future__ import annotations

import ipaddress
import re

import httpx
from hypothesis import given, settings
from hypothesis import strategies as st

from vagent.service.guard import LOCAL_HOSTS, host_name

#: Host headers of a request to a tokenless server: answered, and refused (not an authority whose host
#: is a loopback name: a name followed by more than a port, userinfo, a bare IPv6 address, empty)
ANSWERED = ("127.0.0.1", "localhost", "[::1]", "[::1]:8000", "localhost:8000", "LocalHost.:8765", "127.0.0.1:",
            "[0:0:0:0:0:0:0:1]:80")
REFUSED = ("[::1]evil.com", "[::1]:80x", "localhost:80:80", "evil.com@localhost", "", "localhost@evil.com",
           "[::1].evil.com", "[::1]:80:80", "::1", "[::1", "::1]", "[::1%25lo]", "localhost:8000/", "localhost.evil.com",
           "localhost..", ":8000", "[]:80", "127.0.0.1:-1", "127.0.0.1:+80", "localhost:8\u00b2", "attacker.example:80")


def test_tokenless_server_refuses_a_foreign_host(server):
    for host in REFUSED:
        r = httpx.get(server.url + "/health", headers={"Host": host.encode("latin-1")}, timeout=5)
        assert r.status_code == 403, host
        assert r.json()["error"] == "Forbidden" and "DNS rebinding" in r.json()["detail"]
    for host in (*ANSWERED, f"localhost:{server.port}"):
        assert httpx.get(server.url + "/health", headers={"Host": host}, timeout=5).status_code == 200, host


def loopback_authority(header: str) -> bool:
    """The oracle, written apart from the guard: ``header`` is ``host [":" digits]`` whose host is
    127.0.0.1 or localhost (any case, one trailing dot) or an IPv6 literal of ::1."""
    m = re.fullmatch(r"[ \t]*(?:(?:127\.0\.0\.1|localhost)\.?|\[([0-9a-f:.]+)\])(?::[0-9]*)?[ \t]*", header,
                     flags=re.IGNORECASE | re.ASCII)
    if m is None or m.group(1) is None:
        return m is not None
    try:
        return ipaddress.IPv6Address(m.group(1)) == ipaddress.IPv6Address("::1")
    except ValueError:
        return False


#: pieces of Host headers: the loopback names, and what an attacker puts around them
PIECES = ("127.0.0.1", "localhost", "LocalHost", "[::1]", "[0::1]", "::1", "[", "]", ":", ":80", "80", "x", ".", "@",
          "evil.com", "/", "%6c", " ", "\t", "?", "#", "\u00b2", "\u0661", "v1.x", "0")


@settings(max_examples=600, deadline=None)
@given(st.one_of(st.lists(st.sampled_from(PIECES), min_size=1, max_size=5).map("".join),
                 st.text(alphabet="[]:.@/%0123456789abcdefhlostvx ", max_size=24)))
def test_host_is_answered_exactly_when_it_is_a_loopback_authority(header):
    assert (host_name(header.encode("latin-1", "replace")) in LOCAL_HOSTS) == loopback_authority(header), header


def test_server_with_a_token_answers_any_host(auth_server):
    r = httpx.get(auth_server.url + "/health", headers={"Host": "envs.example"}, timeout=5)
    assert r.status_code == 200
