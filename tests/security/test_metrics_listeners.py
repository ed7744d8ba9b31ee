"""Brokers' and workers' Prometheus metrics are not served to the network by default.

They carry tenant names and each tenant's traffic and spend (`laneway_usage_*`). Before issue
20 `--metrics-port` bound every interface (prometheus_client's default, 0.0.0.0): anyone who could
reach the host read them. Now the listener binds loopback unless `--metrics-host` says otherwise
(the chart and compose pass 0.0.0.0 behind their network policy and unpublished ports). Read
from the kernel's own table of listening sockets, under `laneway up --metrics`.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from loadtest.processes import metrics_port
from tests.wait import eventually

pytestmark = pytest.mark.timeout(300)

LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's `st` column


def listening_on(port: int) -> set[str]:
    """The local addresses with a listening TCP socket on `port` (IPv4 and IPv6)."""
    found = set()
    for table, width in (("/proc/net/tcp", 4), ("/proc/net/tcp6", 16)):
        path = Path(table)
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            address, hex_port = fields[1].split(":")
            if fields[3] != LISTEN or int(hex_port, 16) != port:
                continue
            raw = bytes.fromhex(address)
            # The kernel prints each 32-bit word in host (little-endian) order.
            raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
            found.add(str(ipaddress.ip_address(raw[:width])))
    return found


@pytest.mark.parametrize("role", ["broker", "worker"])
async def test_metrics_listen_on_loopback_only(up, role):
    ports = [port for pid in up.role_pids(role) if (port := metrics_port(pid)) is not None]
    assert ports, f"`laneway up --metrics` gave no {role} a metrics port"
    for port in ports:
        assert await eventually(lambda p=port: bool(listening_on(p)))
        assert listening_on(port) == {"127.0.0.1"}
