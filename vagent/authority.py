"""A ``Host`` header read as an RFC 3986 authority (section 3.2): the name the env service and the
viewer check before they answer a request (DNS rebinding: a page on another site must not drive
a server on loopback). Light: the standard library only."""

from __future__ import annotations

import ipaddress
import re

#: RFC 3986 section 3.2.2 (lower case): reg-name = *( unreserved / pct-encoded / sub-delims ), and an
#: IP literal's IPvFuture; section 3.2.3: port = *DIGIT
_REG_NAME = re.compile(r"(?:[a-z0-9\-._~!$&'()*+,;=]|%[0-9a-f]{2})+")
_IPV_FUTURE = re.compile(r"v[0-9a-f]+\.[a-z0-9\-._~!$&'()*+,;=:]+")
_PORT = re.compile(r"(?::[0-9]*)?")


def host_name(header: str | bytes | None) -> str | None:
    """The host of a ``Host`` header read as an RFC 3986 authority without userinfo, ``host [":"
    port]`` (host: an IP literal in brackets, an IPv4 address or a registered name; port: digits),
    lower case, without the port and a trailing dot, an IPv6 address in its short form
    (``[::1]:8765`` -> ``[::1]``, ``LocalHost.:8765`` -> ``localhost``). None without a header or
    for one that is no such authority (``[::1]evil.com``, ``localhost:80:80``, ``evil.com@localhost``,
    ``[::1]:80x``, an empty one), which no server answers to."""
    if header is None:
        return None
    text = (header.decode("latin-1") if isinstance(header, bytes) else header).strip(" \t").lower()
    if text.startswith("["):
        end = text.find("]")
        host, rest = (_ip_literal(text[1:end]), text[end + 1:]) if end > 0 else (None, "")
    else:
        name, colon, port = text.partition(":")
        host, rest = name[:-1] if name.endswith(".") else name, colon + port
        host = host if _REG_NAME.fullmatch(host) else None
    return host if host is not None and _PORT.fullmatch(rest) else None


def _ip_literal(inside: str) -> str | None:
    """``[inside]`` for an IPv6 address (short form; no zone) or an IPvFuture, else None."""
    if _IPV_FUTURE.fullmatch(inside):
        return f"[{inside}]"
    try:
        return f"[{ipaddress.IPv6Address(inside).compressed}]" if "%" not in inside else None
    except ValueError:
        return None
