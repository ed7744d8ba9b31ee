"""Rule sets in the `lw_routing` KV bucket of a real nats-server: versions, optimistic
concurrency, history, rollback beyond the bucket's own history, live watching, and the
`laneway routing` command."""

from __future__ import annotations

import argparse
import asyncio
import json
import uuid
from pathlib import Path

import msgspec
import nats
import pytest

from core.kvwatch import BucketWatch
from core.routing import rules as rule_docs
from core.routing.rules import RuleSet, decode
from core.routing.store import (
    ROUTING_HISTORY,
    RULES_KEY,
    RuleStore,
    VersionConflict,
    VersionNotFound,
    is_rules_key,
    version_key,
)
from core.topology import StreamLimits, ensure_topology
from laneway import ops_routing
from schemas.subjects import Subjects
from tests.wait import eventually


def ruleset(large_weight: float = 1.0, reason: str = "") -> RuleSet:
    return decode(
        json.dumps(
            {
                "pools": {"small": {}, "large": {}},
                "rules": [{"rule_id": "all", "pools": {"small": 1, "large": large_weight}}],
                "author": "test",
                "reason": reason,
            }
        ).encode()
    )


@pytest.fixture
async def nc(nats_server):
    client = await nats.connect(nats_server.url)
    yield client
    await client.close()


@pytest.fixture
async def store(nc) -> RuleStore:
    # A fresh prefix per test: its own bucket, as topology creates it for a deployment.
    s = Subjects(f"t{uuid.uuid4().hex[:8]}")
    await ensure_topology(nc.jetstream(), s, StreamLimits())
    return await RuleStore.open(nc.jetstream(), s)


async def test_versions_count_up_from_one(store: RuleStore) -> None:
    assert await store.get_current() is None
    first = await store.put(ruleset(1), expected_version=0)
    second = await store.put(ruleset(2), expected_version=1)
    assert (first.version, second.version) == (1, 2)
    assert second.created_at >= first.created_at > 0
    current = await store.get_current()
    assert current == second and current.rules[0].pools["large"] == 2


async def test_a_stale_expected_version_is_a_conflict(store: RuleStore) -> None:
    await store.put(ruleset(1), expected_version=0)
    with pytest.raises(VersionConflict) as exc:
        await store.put(ruleset(2), expected_version=0)
    assert (exc.value.expected, exc.value.actual) == (0, 1)


async def test_concurrent_writers_one_wins(store: RuleStore) -> None:
    await store.put(ruleset(1), expected_version=0)
    outcomes = await asyncio.gather(
        *(store.put(ruleset(w), expected_version=1) for w in (2, 3, 4, 5)), return_exceptions=True
    )
    winners = [o for o in outcomes if isinstance(o, RuleSet)]
    assert len(winners) == 1 and winners[0].version == 2
    assert all(isinstance(o, VersionConflict) for o in outcomes if o is not winners[0])
    assert [v.version for v in await store.history()] == [1, 2]


async def test_history_and_rollback_beyond_the_bucket_history(store: RuleStore) -> None:
    for i in range(ROUTING_HISTORY + 4):  # more versions than the bucket keeps per key
        await store.put(ruleset(i + 1, reason=f"step {i + 1}"), expected_version=i)
    history = await store.history()
    assert [v.version for v in history] == list(range(1, ROUTING_HISTORY + 5))
    restored = await store.rollback(1, author="ops", reason="bad tuning")
    assert restored.version == ROUTING_HISTORY + 5 and restored.rollback_of == 1
    assert restored.rules == history[0].rules and restored.author == "ops"
    assert (await store.get_current()) == restored
    assert (await store.history())[-1] == restored  # history only grows
    with pytest.raises(VersionNotFound):
        await store.rollback(999, author="ops")
    with pytest.raises(VersionConflict):
        await store.rollback(2, author="ops", expected_version=3)


async def test_a_lost_archive_write_is_repaired(store: RuleStore) -> None:
    """A writer that died between its compare-and-set and its archive write leaves `rules` at a
    version with no `rules.v<N>`: history and the next write fill it in."""
    await store.put(ruleset(1), expected_version=0)
    stored = await store.put(ruleset(2), expected_version=1)
    await store._kv.purge(version_key(2))
    assert [v.version for v in await store.history()] == [1, 2]
    assert (await store.get_version(2)) == stored


async def test_the_broker_watch_applies_rules_live_and_skips_bad_documents(nc, store: RuleStore) -> None:
    applied: list[RuleSet] = []
    seen: list[str] = []

    def on_put(key: str, value: bytes) -> None:  # what the broker's _put_routing does
        seen.append(key)
        if is_rules_key(key):
            applied.append(rule_docs.decode(value))

    await store.put(ruleset(1), expected_version=0)
    watch = BucketWatch(nc.jetstream(), store._kv._name, on_put, lambda key: None)
    await watch.start()
    try:
        assert [r.version for r in applied] == [1]
        seen.clear()
        await store.put(ruleset(5), expected_version=1)
        await store._kv.put(RULES_KEY, b'{"pools": {}, "rules": []}')  # hand-edited garbage
        await store._kv.put("models", b"{}")
        # the watch applies puts in order: once the last one ("models") is seen, so was the garbage
        assert await eventually(lambda: "models" in seen), "the watch never saw the last put"
        assert [r.version for r in applied] == [1, 2]  # the invalid one was logged and skipped
    finally:
        await watch.stop()


# -- the command line -----------------------------------------------------------------------------


def cli(nats_url: str, prefix: str, *argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    ops_routing.configure(parser)
    return parser.parse_args(["--nats-url", nats_url, "--prefix", prefix, *argv])


async def test_routing_command(nats_server, tmp_path: Path, capsys) -> None:
    prefix = f"c{uuid.uuid4().hex[:8]}"
    url = nats_server.url
    doc = tmp_path / "rules.json"
    doc.write_bytes(rule_docs.encode(ruleset(1, reason="first")))
    assert await ops_routing.run(cli(url, prefix, "set", str(doc), "--author", "ana")) == 0
    assert "stored version 1" in capsys.readouterr().out

    # No evaluator and a baseline exists: the gate cannot judge, so only a forced change applies.
    doc.write_bytes(rule_docs.encode(ruleset(3)))
    assert await ops_routing.run(cli(url, prefix, "set", str(doc))) == 3
    assert "not measured" in capsys.readouterr().err
    assert await ops_routing.run(cli(url, prefix, "set", str(doc), "--force-reason", "eval cluster down")) == 0
    assert "FORCED" in capsys.readouterr().out
    assert (
        await ops_routing.run(cli(url, prefix, "set", str(doc), "--expected-version", "1", "--force-reason", "x")) == 4
    )

    bad = tmp_path / "bad.json"
    bad.write_text('{"pools": {"small": {}}, "rules": [{"rule_id": "a", "pools": {"huge": 1}}]}')
    assert await ops_routing.run(cli(url, prefix, "set", str(bad))) == 2
    assert "rules[0].pools.huge" in capsys.readouterr().err

    assert await ops_routing.run(cli(url, prefix, "rollback", "1", "--reason", "undo")) == 0
    assert await ops_routing.run(cli(url, prefix, "rollback", "42")) == 5
    capsys.readouterr()
    assert await ops_routing.run(cli(url, prefix, "history")) == 0
    out = capsys.readouterr().out
    assert "FORCED: eval cluster down" in out and "rollback of v1" in out
    assert await ops_routing.run(cli(url, prefix, "show", "--json")) == 0
    shown = msgspec.json.decode(capsys.readouterr().out.encode())
    assert shown["version"] == 3 and shown["rollback_of"] == 1 and shown["rules"][0]["pools"]["large"] == 1.0
