"""Ports chosen before a server binds them stay clear of the ports the kernel hands out itself."""

from __future__ import annotations

import socket

import pytest

from core import ports
from core.ports import ephemeral_range, free_port


def test_free_ports_are_distinct_bindable_and_outside_the_ephemeral_range() -> None:
    low, high = ephemeral_range()
    chosen = [free_port() for _ in range(20)]
    assert len(set(chosen)) == len(chosen)
    assert not any(low <= p <= high for p in chosen)
    for port in chosen:
        with socket.socket() as s:
            s.bind(("0.0.0.0", port))


def test_a_port_bound_by_someone_else_is_never_chosen(monkeypatch) -> None:
    # Narrow the choice to the 300 ports below the ephemeral range (which here reaches the top),
    # hold all but five of them on loopback: those five come back, then nothing is left.
    low, _ = ephemeral_range()
    monkeypatch.setattr(ports, "ephemeral_range", lambda: (low, 65535))
    monkeypatch.setattr(ports, "_LOWEST", low - 300)
    monkeypatch.setattr(ports, "_handed_out", set())
    held, left = [], []
    try:
        for port in range(low - 300, low):
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                s.close()  # somebody else's: not choosable either
                continue
            (left if len(left) < 5 else held).append(s)
        free = sorted(s.getsockname()[1] for s in left)
        for s in left:
            s.close()
        assert sorted(free_port() for _ in free) == free
        with pytest.raises(OSError, match="no free port"):
            free_port()
    finally:
        for s in held:
            s.close()


def test_a_host_whose_ephemeral_range_covers_everything_gets_the_kernels_choice(monkeypatch) -> None:
    monkeypatch.setattr(ports, "ephemeral_range", lambda: (1024, 65535))
    port = free_port()
    with socket.socket() as s:
        s.bind(("0.0.0.0", port))
