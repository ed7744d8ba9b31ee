"""When the holder of a liveness subject counts as gone (core/liveness.py): no interest for the
threshold without a break, and only once it was found alive."""

from __future__ import annotations

from core.liveness import Silence


def test_a_bridge_without_interest_is_gone_only_after_the_threshold():
    silence = Silence(gone_after_s=3.0)
    silence.heard("e1", interest=True, now=9.0)
    silence.heard("e1", interest=False, now=10.0)
    silence.heard("e1", interest=False, now=12.9)
    assert not silence.gone("e1", 12.9)
    silence.heard("e1", interest=False, now=13.0)
    assert silence.gone("e1", 13.0)
    assert not silence.gone("e2", 13.0)  # never probed: not gone


def test_interest_between_silences_starts_the_count_again():
    """A bridge reconnecting (a NATS restart, a move to another server) is not a dead one."""
    silence = Silence(gone_after_s=3.0)
    silence.heard("e1", interest=True, now=0.0)
    silence.heard("e1", interest=False, now=0.0)
    silence.heard("e1", interest=True, now=2.0)
    silence.heard("e1", interest=False, now=2.5)
    assert not silence.gone("e1", 5.0)
    assert silence.gone("e1", 5.5)


def test_bridges_no_running_request_names_are_forgotten():
    silence = Silence(gone_after_s=3.0)
    for edge in ("e1", "e2"):
        silence.heard(edge, interest=True, now=0.0)
        silence.heard(edge, interest=False, now=0.0)
    silence.keep({"e2"})
    silence.heard("e1", interest=False, now=4.0)
    assert not silence.gone("e1", 4.0) and silence.gone("e2", 4.0)


def test_a_bridge_never_found_alive_is_never_gone():
    """One whose NATS user may not subscribe to lw.alive.* (stale permissions) shows no interest
    while it serves: its streams must not be cancelled for that."""
    silence = Silence(gone_after_s=3.0)
    silence.heard("stale", interest=False, now=0.0)
    assert not silence.gone("stale", 10.0) and silence.never_heard("stale", 10.0)
    silence.heard("stale", interest=True, now=11.0)  # once alive, its silence counts
    silence.heard("stale", interest=False, now=12.0)
    assert silence.gone("stale", 15.0) and not silence.never_heard("stale", 15.0)


def test_bridges_found_alive_are_remembered_up_to_a_bound():
    silence = Silence(gone_after_s=3.0, remember=2)
    for edge in ("e1", "e2", "e3"):
        silence.heard(edge, interest=True, now=0.0)
        silence.heard(edge, interest=False, now=1.0)
    assert not silence.gone("e1", 5.0)  # the oldest forgotten: treated as never heard
    assert silence.gone("e2", 5.0) and silence.gone("e3", 5.0)
