"""`laneway up` hands each flag it does not take itself to the roles whose commands take it, and
starts as many brokers and workers as asked, each worker with an id of its own."""

from __future__ import annotations

import pytest

from laneway.cli import build_parser
from laneway.up_flags import ROLES, FlagError, instances, route_flags, worker_argvs


def routed(*argv: str) -> dict[str, list[str]]:
    args, forwarded = build_parser().parse_known_args(["up", *argv])
    return route_flags(forwarded, {role: args.subcommands[role] for role in ROLES})


def test_each_flag_goes_to_the_roles_that_take_it():
    r = routed("--ack-wait", "10", "--sim-profile", "zero", "--prefix=xy", "--no-quotas")
    assert r["broker"] == ["--ack-wait", "10", "--prefix=xy", "--no-quotas"]
    assert r["bridge"] == ["--prefix=xy"]  # stream limits are provisioning's (`up` runs it)
    assert r["worker"] == ["--sim-profile", "zero", "--prefix=xy"]


def test_up_keeps_its_own_flags():
    args, forwarded = build_parser().parse_known_args(["up", "--port", "9000", "--pii", "regex"])
    assert forwarded == [] and args.port == 9000 and args.pii == "regex"


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--bogus", "1"], "unrecognized arguments: --bogus 1"),
        (["--metrics-port", "9100"], "each process needs its own port"),
        (["--nats-url", "nats://elsewhere:4222"], "runs its own nats-server"),
    ],
)
def test_flags_no_role_can_take_are_refused_by_name(argv, message):
    with pytest.raises(FlagError, match=message):
        routed(*argv)


def test_brokers_and_workers_default_to_one_each_and_are_up_s_own():
    args, forwarded = build_parser().parse_known_args(["up"])
    assert (args.brokers, args.workers, args.metrics) == (1, 1, True)  # every process's metrics
    args, forwarded = build_parser().parse_known_args(["up", "--brokers", "3", "--workers=2", "--no-metrics"])
    assert forwarded == [] and (args.brokers, args.workers, args.metrics) == (3, 2, False)
    assert build_parser().parse_known_args(["up", "--metrics"])[0].metrics  # as before it was the default


@pytest.mark.parametrize("flag", ["--brokers", "--workers"])
def test_no_fewer_than_one_broker_or_worker(flag, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_known_args(["up", flag, "0"])
    assert "must be 1 or more, not 0" in capsys.readouterr().err


def test_one_child_keeps_the_role_s_name_several_are_numbered():
    assert instances("broker", 1) == ["broker"]
    assert instances("broker", 3) == ["broker-1", "broker-2", "broker-3"]


def _worker_ids(argvs: list[list[str]]) -> list[str | None]:
    """The id each worker process would run with, as its own parser reads its argv."""
    return [build_parser().parse_args(["worker", *argv]).worker_id for argv in argvs]


def test_several_workers_given_one_id_get_unique_ones():
    argv = ["--nats-url", "nats://x:1", "--worker-id", "gpu0", "--pool", "sim"]
    assert _worker_ids(worker_argvs(argv, 1)) == ["gpu0"]
    assert _worker_ids(worker_argvs(argv, 3)) == ["gpu0-1", "gpu0-2", "gpu0-3"]
    assert _worker_ids(worker_argvs(["--worker-id=gpu0"], 2)) == ["gpu0-1", "gpu0-2"]


def test_workers_without_an_id_each_draw_their_own():
    argvs = worker_argvs(["--nats-url", "nats://x:1"], 2)
    assert _worker_ids(argvs) == [None, None]  # WorkerConfig.with_id draws one per process
