"""`laneway up` hands each flag it does not take itself to the roles whose commands take it."""

from __future__ import annotations

import pytest

from laneway.cli import build_parser
from laneway.up import ROLES, FlagError, route_flags


def routed(*argv: str) -> dict[str, list[str]]:
    args, forwarded = build_parser().parse_known_args(["up", *argv])
    return route_flags(forwarded, {role: args.subcommands[role] for role in ROLES})


def test_each_flag_goes_to_the_roles_that_take_it():
    r = routed("--ack-wait", "10", "--sim-profile", "zero", "--prefix=xy", "--no-quotas")
    assert r["broker"] == ["--ack-wait", "10", "--prefix=xy", "--no-quotas"]
    assert r["bridge"] == ["--ack-wait", "10", "--prefix=xy"]
    assert r["worker"] == ["--sim-profile", "zero", "--prefix=xy"]


def test_up_keeps_its_own_flags():
    args, forwarded = build_parser().parse_known_args(["up", "--port", "9000", "--pii", "regex"])
    assert forwarded == [] and args.port == 9000 and args.pii == "regex"


@pytest.mark.parametrize("argv,message", [
    (["--bogus", "1"], "unrecognized arguments: --bogus 1"),
    (["--metrics-port", "9100"], "each process needs its own port"),
    (["--nats-url", "nats://elsewhere:4222"], "runs its own nats-server"),
])
def test_flags_no_role_can_take_are_refused_by_name(argv, message):
    with pytest.raises(FlagError, match=message):
        routed(*argv)
