"""What `laneway ops provision` waits out (NATS still starting) and what it reports at once."""

from __future__ import annotations

import nats.errors
import nats.js.errors
import pytest

from core.provision import NO_SUITABLE_PEERS, not_ready_yet


@pytest.mark.parametrize(
    "exc",
    [
        ConnectionRefusedError(111, "Connection refused"),
        nats.errors.NoServersError(),
        nats.errors.NoRespondersError(),
        nats.errors.TimeoutError(),
        nats.js.errors.ServiceUnavailableError(code=503),
        nats.js.errors.BadRequestError(
            code=400, err_code=NO_SUITABLE_PEERS, description="no suitable peers for placement"
        ),
    ],
    ids=["refused", "no-servers", "no-jetstream", "no-meta-leader", "unavailable", "no-placement"],
)
def test_a_starting_cluster_is_waited_for(exc: Exception) -> None:
    assert not_ready_yet(exc)


@pytest.mark.parametrize(
    "exc",
    [
        nats.errors.Error("nats: 'Authorization Violation'"),
        nats.js.errors.BadRequestError(
            code=400, err_code=10052, description="replicas > 1 not supported in non-clustered mode"
        ),
        nats.js.errors.APIError(code=500, err_code=10047, description="insufficient storage resources available"),
        ValueError("a bug"),
    ],
    ids=["not-allowed", "not-clustered", "no-storage", "a-bug"],
)
def test_what_a_later_run_would_meet_again_is_reported_at_once(exc: Exception) -> None:
    assert not not_ready_yet(exc)
