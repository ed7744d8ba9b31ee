"""The scheduler lease's timing and the peer count: pure, time passed in."""

from __future__ import annotations

from broker.scheduler.lease import LeaseClock
from broker.scheduler.peers import Peers


def test_a_lease_is_renewed_every_third_of_its_life_and_given_up_before_it_can_lapse():
    clock = LeaseClock(ttl_s=3.0)
    assert not clock.held and not clock.lapsed(100.0)
    clock.wrote(100.0)
    assert clock.held and clock.every_s == 1.0
    assert not clock.lapsed(101.9)  # one renewal missed: still safe
    # Two missed: the key (max_age 3 s from the last write) may expire before a third try.
    assert clock.lapsed(102.0)
    clock.wrote(101.5)  # a renewal sent at 101.5 landed
    assert not clock.lapsed(103.0)
    clock.lost()
    assert not clock.held and not clock.lapsed(1e9)


def test_peers_count_only_other_brokers_heard_recently():
    peers = Peers("me", stale_s=6.0)
    peers.saw("me", 0.0)
    assert peers.alive(0.0) == 0
    peers.saw("a", 0.0)
    peers.saw("b", 4.0)
    assert peers.alive(5.0) == 2
    assert peers.alive(6.5) == 1  # a went silent
    peers.saw("a", 7.0)
    assert peers.alive(7.0) == 2
    assert peers.alive(20.0) == 0
