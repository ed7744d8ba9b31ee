"""Ports to hand to a server before it starts (`laneway up`'s metrics ports, tests, benchmarks).

A port chosen by binding port 0 comes from the kernel's ephemeral range, and closing the probe
gives it back to that range: between choosing and the server's bind, any outbound connection
(a cluster route dialling its peers) or any port-0 listener may take it, and the server fails with
"address already in use". Ports below the ephemeral range are never handed out implicitly, so
only another explicit bind can take one; and this process never hands out the same one twice.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

_LOWEST = 10000  # above the registered services commonly bound on a host
_handed_out: set[int] = set()
_random = random.Random()  # not the global one, which a caller may have seeded


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for implicit ports (Linux; the default elsewhere)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def _binds(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("", port))  # the IPv4 wildcard: taken if bound on any IPv4 address
        except OSError:
            return False
    return True


def free_port() -> int:
    """A port free on every IPv4 address now (a server may listen on 0.0.0.0), outside the
    ephemeral range, and not handed out before by this process. Where the ephemeral range
    leaves no such port (a host tuned to 1024-65535), the kernel's choice, as before."""
    low, high = ephemeral_range()
    outside = [*range(_LOWEST, min(low, 65536)), *range(max(high + 1, _LOWEST), 65536)]
    candidates = [p for p in outside if p not in _handed_out]
    _random.shuffle(candidates)
    for port in candidates:
        if _binds(port):
            _handed_out.add(port)
            return port
    if outside:
        raise OSError(f"no free port outside the ephemeral range {low}-{high}")
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def port_taken(host: str, port: int) -> str | None:
    """Why a server could not listen on host:port now (None: it could). Checked before anything
    starts, so a clash is said at once, not after a log fills with retries."""
    if port == 0:
        return None
    try:
        socket.create_server((host, port)).close()
    except OSError as exc:
        return f"cannot listen on {host}:{port}: {exc.strerror or exc}"
    return None
