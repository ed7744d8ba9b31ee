"""Ports to hand to a server before it starts (tests, benchmarks, local trials).

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

_LOWEST = 10000                 # above the registered services commonly bound on a host
_handed_out: set[int] = set()


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for implicit ports (Linux; the default elsewhere)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def free_port(host: str = "") -> int:
    """A port free on every interface now (a server may listen on 0.0.0.0), outside the
    ephemeral range, and not handed out before by this process."""
    low, high = ephemeral_range()
    candidates = [p for p in (range(_LOWEST, low) if low > _LOWEST else range(high + 1, 65536))
                  if p not in _handed_out]
    random.shuffle(candidates)
    for port in candidates:
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise OSError(f"no free port outside the ephemeral range {low}-{high}")
