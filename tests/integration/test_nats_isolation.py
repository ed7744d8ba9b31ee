"""The whole stack under the NATS users `laneway up` generates (laneway/nats_config.up_auth):
broker, worker and bridge each with its own role, the operator tools as `ops`, NATS clients as
their tenant. Every feature works (data path, cancels, cache, usage, quotas, PII audit, the
three ways into the DLQ, the cascade, the routing admin API, live classes and tenants), and
the server logs no permission violation for any of them: the log is the detector of a missing
right. Tenant A still cannot read B's tokens or publish requests as B."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import aiohttp
import nats
import pytest

from bridge.admin import AdminConfig
from bridge.app import Bridge
from bridge.client import LanewayClient, LanewayError
from core.models import put_models
from core.natsd import NatsServer
from core.policy.pii import Action, TenantPiiPolicy
from core.policy.quota import QuotaPolicy
from core.policy.tenants import Tenant, hash_key
from core.routing.store import connect_store
from core.settings import LogicalModel, Settings
from core.topology import StreamLimits
from core.usage_log import read_usage
from laneway.nats_config import UpAuth, up_auth
from loadtest.stack import Stack
from schemas import codec
from schemas.resume import ResumeAsk
from schemas.subjects import Subjects, service_inbox
from schemas.work import Credit, Fence, Fenced
from tests.clock import Clock
from tests.integration.test_cascade_live import UnsureOnHardPrompts
from tests.integration.test_poison_and_overload import PoisonableEngine
from tests.requests import chat
from tests.wait import eventually
from workers.engines.sim.engine import SimEngine
from workers.engines.sim.roofline import PROFILES
from workers.runner import WorkerConfig

pytestmark = pytest.mark.timeout(240)

S = Subjects("lw")
KEYS = {"alpha": "sk-alpha", "beta": "sk-beta", "tight": "sk-tight"}
ADMIN_KEY = "lw-admin-" + "c" * 24
VIOLATION = " Violation - "  # nats-server: `"$G/user:svc-worker" - Publish Violation - Subject ...`
RULES = {
    "pools": {"sim": {"cost_out_per_1m": 0.1}, "large": {"cost_out_per_1m": 1.2}},
    "rules": [{"rule_id": "auto", "match": {"model": "auto"}, "pools": {"sim": 1}, "escalate_to": "large"}],
    "models": ["auto"],
    "cascade": {"window": 3, "min_mean_logprob": -1.0},
}


class SmallModel(PoisonableEngine, UnsureOnHardPrompts):
    """The `sim` pool: fails on POISON (the DLQ), unsure on HARD (the cascade)."""


def settings() -> Settings:
    tenants = {name: Tenant(name=name, api_key_sha256=[hash_key(key)]) for name, key in KEYS.items()}
    # Slots come back only when the broker reads the request's usage record.
    tenants["tight"] = Tenant(
        name="tight", api_key_sha256=[hash_key(KEYS["tight"])], quota=QuotaPolicy(requests_per_min=3, max_concurrent=1)
    )
    tenants["alpha"] = Tenant(
        name="alpha",
        api_key_sha256=[hash_key(KEYS["alpha"])],
        pii=TenantPiiPolicy(entities={"PHONE_NUMBER": Action.redact}),
    )
    return Settings(
        tenants=tenants, models={"laneway-sim": LogicalModel(pool="sim"), "slow": LogicalModel(pool="large")}
    )


class ViolationLog:
    """The server log's permission violations, read on from where the last read stopped."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0

    def all(self) -> list[str]:
        return [line for line in self.path.read_text().splitlines() if VIOLATION in line]

    def new(self) -> list[str]:
        text = self.path.read_text()
        fresh, self._offset = text[self._offset :], len(text)
        return [line for line in fresh.splitlines() if VIOLATION in line]


class Secured:
    def __init__(self, root: Path, server: NatsServer, auth: UpAuth) -> None:
        self.root, self.server, self.auth = root, server, auth
        self.stack: Stack | None = None
        self.log = ViolationLog(server.log_file)

    def make_stack(self, **overrides) -> Stack:
        """The stack, each service as its own user."""
        options = dict(
            engines=[SmallModel(PROFILES["zero"]), SimEngine(PROFILES["llama-8b-h100"])],
            pools=["sim", "large"],
            limits=StreamLimits(max_deliver=2, ack_wait_s=2.0),
            worker_config=WorkerConfig(in_progress_s=0.5),
            pii="regex",
            admin=AdminConfig((hash_key(ADMIN_KEY),)),
        )
        return Stack(
            self.server.url,
            settings(),
            credentials=dict(self.auth.services),  # ops provisions
            **{**options, **overrides},
        )

    async def connect(self, role: str, **options) -> nats.aio.client.Client:
        user, password = self.auth.services[role]
        return await nats.connect(
            self.server.url, user=user, password=password, inbox_prefix=service_inbox(user), **options
        )

    async def tenant(self, name: str, errors: list[str] | None = None) -> nats.aio.client.Client:
        async def on_error(exc: Exception) -> None:
            if errors is not None:
                errors.append(str(exc))

        user, password = self.auth.tenants[name]
        return await nats.connect(
            self.server.url, user=user, password=password, inbox_prefix=f"_INBOX_{name}", error_cb=on_error
        )

    def laneway(self, *argv: str) -> subprocess.CompletedProcess:
        """An operator command, as `ops` through the environment."""
        user, password = self.auth.services["ops"]
        env = {
            **os.environ,
            "LANEWAY_NATS_URL": self.server.url,
            "LANEWAY_NATS_USER": user,
            "LANEWAY_NATS_PASSWORD": password,
        }
        return subprocess.run(
            [sys.executable, "-m", "laneway.cli", *argv], capture_output=True, text=True, timeout=60, env=env
        )

    async def chat(self, tenant: str, content: str, model: str = "laneway-sim", **extra) -> tuple[int, dict]:
        body = {"model": model, "max_tokens": 4, "messages": [{"role": "user", "content": content}], **extra}
        async with aiohttp.ClientSession(base_url=self.stack.url) as http:
            async with http.post(
                "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {KEYS[tenant]}"}
            ) as resp:
                return resp.status, await resp.json()


@pytest.fixture(scope="module")
async def secured(tmp_path_factory):
    root = tmp_path_factory.mktemp("secured")
    auth = up_auth(S, list(KEYS), root)
    # As `laneway up` does: the authorization block included from the server's own config.
    config = root / "nats.conf"
    config.write_text(f'include "{auth.authorization_file.name}"\n')
    env = Secured(root, NatsServer(root / "store", config_file=config), auth)
    await env.server.start()
    try:
        env.stack = await env.make_stack().__aenter__()
        yield env
        if env.stack is not None:  # the last test stops it itself
            await env.stack.__aexit__(None, None, None)
    finally:
        await env.server.stop()


async def test_tenants_stay_in_their_lane(secured):
    assert secured.log.new() == [], "starting the stack"
    errors_a: list[str] = []
    alpha = await secured.tenant("alpha", errors_a)
    beta = await secured.tenant("beta")
    try:
        # A works as itself, end to end, with its own inbox prefix for PubAcks.
        async with LanewayClient(alpha, "alpha") as client:
            text = "".join([t async for t in client.generate(chat("hi", max_tokens=3))])
            assert len(text.split()) == 3

        # A tries to read B's token frames: the server refuses the subscription.
        stolen: list = []

        async def steal(msg):
            stolen.append(msg)

        await alpha.subscribe("lw.tok.beta.>", cb=steal)
        await alpha.flush()
        async with LanewayClient(beta, "beta") as client:
            assert [t async for t in client.generate(chat("secret", max_tokens=2))]
        assert await eventually(lambda: any("lw.tok.beta" in e for e in errors_a), timeout=5)
        assert stolen == [] and all("permissions violation" in e.lower() for e in errors_a)

        # A tries to publish a request as B: refused, nothing stored, and the client says why
        # (the server drops the publish, so JetStream alone would only time out).
        async with LanewayClient(alpha, "beta") as client:
            with pytest.raises(LanewayError) as err:
                await client.generate(chat("as beta", max_tokens=2), klass="interactive").__anext__()
        assert err.value.code == "permission_denied", err.value
        assert 'publish to "lw.req.interactive.beta"' in err.value.message.lower(), err.value
        await alpha.publish("lw.req.interactive.beta", b"x")
        await alpha.flush()
        assert await eventually(lambda: any("lw.req.interactive.beta" in e for e in errors_a), timeout=5)
    finally:
        await alpha.close()
        await beta.close()
    # Wait for every refusal's log line, so that none lands in the next test's check.
    refused: list[str] = []

    def logged_all() -> bool:
        refused.extend(secured.log.new())
        return (
            any("lw.tok.beta" in line for line in refused)
            and sum("lw.req.interactive.beta" in line for line in refused) >= 2
        )

    assert await eventually(logged_all, timeout=30), refused
    print("\n".join(refused))
    assert all('user:tenant-alpha"' in line for line in refused), refused


async def test_cancels_from_a_tenant_and_from_the_edge_reach_the_engine(secured):
    worker = next(w for w in secured.stack.workers if w.config.pool == "large")

    def cancelled() -> float:
        return (
            worker.metrics.registry.get_sample_value(
                "laneway_worker_finished_total", {"pool": "large", "reason": "cancelled"}
            )
            or 0.0
        )

    # A tenant on NATS stops reading: its client publishes the cancel, as itself.
    alpha = await secured.tenant("alpha")
    try:
        async with LanewayClient(alpha, "alpha") as client:
            stream = client.generate(chat("go on", model="slow", max_tokens=2000))
            await stream.__anext__()
            await stream.aclose()
        assert await eventually(lambda: cancelled() == 1, timeout=10)
    finally:
        await alpha.close()
    # An HTTP client drops its stream: the bridge publishes the cancel, once its resume window
    # (short here: the generation must outlive it) has passed with no client back.
    body = {"model": "slow", "stream": True, "max_tokens": 2000, "messages": [{"role": "user", "content": "go on"}]}
    async with (
        Bridge(replace(secured.stack.bridge.config, port=0, resume_window_s=0.5), settings()) as bridge,
        aiohttp.ClientSession(base_url=bridge.url) as http,
    ):
        await bridge.wait_ready()
        resp = await http.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {KEYS['beta']}"})
        assert resp.status == 200 and await resp.content.readline()
        resp.close()  # the connection, mid-stream
        assert await eventually(lambda: cancelled() == 2, timeout=10)
    assert secured.log.new() == []


async def test_a_fence_from_the_scheduler_drops_a_worker_s_request_and_no_tenant_can_send_one(secured):
    """The scheduler's fence (broker/sweep.py) under the generated users: the broker's user
    publishes it, the worker's reads it and drops the named request without a usage record. A
    tenant that publishes one (to make a worker drop others' work) is refused by the server."""
    worker = next(w for w in secured.stack.workers if w.config.pool == "large")

    def fenced() -> float:
        return worker.metrics.registry.get_sample_value("laneway_worker_fenced_total", {"pool": "large"}) or 0.0

    alpha, broker = await secured.tenant("alpha"), await secured.connect("broker")
    try:
        async with LanewayClient(alpha, "alpha") as client:
            stream = client.generate(chat("go on", model="slow", max_tokens=2000), request_id="fence-me")
            await stream.__anext__()
            key = next(k for k in worker._active if k.request_id == "fence-me")
            fence = codec.encode(Fence([Fenced(key.tenant, key.request_id, 1)]))
            await alpha.publish(S.fence(worker.id), fence)  # the attack: refused, nothing dropped
            await alpha.flush()
            assert await eventually(lambda: any("alpha" in line and ".fence." in line for line in secured.log.new()))
            assert fenced() == 0 and key in worker._active
            await broker.publish(S.fence(worker.id), fence)
            assert await eventually(lambda: fenced() == 1 and key not in worker._active, timeout=10)
            await stream.aclose()
    finally:
        await alpha.close()
        await broker.close()
    assert secured.log.new() == []


async def test_a_stream_resumes_through_another_bridge_and_no_tenant_reaches_the_resume_subject(secured):
    """Two bridge replicas under the bridge role: a stream cut at one resumes at the other over
    `lw.resume.<edge>` with no violation logged. A tenant's user asking a bridge for a stream
    directly (as another tenant) or listening to the relays is refused by the server."""
    async with (
        Bridge(replace(secured.stack.bridge.config, port=0), settings()) as second,
        aiohttp.ClientSession() as http,
    ):
        await second.wait_ready()
        body = {"model": "slow", "stream": True, "max_tokens": 50, "messages": [{"role": "user", "content": "on"}]}
        headers = {"Authorization": f"Bearer {KEYS['beta']}", "x-laneway-resumable": "true"}
        resp = await http.post(secured.stack.url + "/v1/chat/completions", json=body, headers=headers)
        assert resp.status == 200
        last_id = ""
        while not last_id:
            line = (await resp.content.readline()).decode()
            last_id = line[4:].strip() if line.startswith("id: ") else ""
        resp.close()
        async with http.post(
            second.url + "/v1/chat/completions", json={}, headers={**headers, "Last-Event-ID": last_id}
        ) as resumed:
            assert resumed.status == 200 and (await resumed.read()).endswith(b"data: [DONE]\n\n")
        assert second.metrics.registry.get_sample_value("laneway_streams_resumed_total", {"via": "relay"}) is None
        assert (
            secured.stack.bridge.metrics.registry.get_sample_value("laneway_streams_resumed_total", {"via": "relay"})
            == 1
        )
    assert secured.log.new() == []

    errors: list[str] = []
    alpha = await secured.tenant("alpha", errors)
    try:
        relayed: list = []

        async def got(msg):
            relayed.append(msg)

        await alpha.subscribe(S.resume_all, cb=got)
        edge, request_id, n = last_id.split(".")
        ask = ResumeAsk("beta", request_id, int(n), "/v1/chat/completions", S.resume_reply(edge, "stolen"))
        await alpha.publish(S.resume(edge), codec.encode(ask))
        await alpha.flush()
        assert await eventually(lambda: sum("lw.resume" in e for e in errors) >= 2, timeout=10), errors
        assert relayed == []
    finally:
        await alpha.close()
    refused: list[str] = []

    def logged_both() -> bool:
        refused.extend(secured.log.new())
        return sum("lw.resume" in line for line in refused) >= 2

    assert await eventually(logged_both, timeout=30), refused
    assert all('user:tenant-alpha"' in line for line in refused), refused


async def test_a_repeated_request_is_a_cache_hit(secured):
    stack = secured.stack
    prompt = "What is the capital of France? (cache under roles)"
    cache = stack.broker.gate.cache
    answers: list[str] = []

    # The worker stores an answer after replying: repeat until the broker's lookup hits.
    async def hit() -> bool:
        served, hits = stack.finished("sim"), cache.hits
        status, body = await secured.chat("beta", prompt, temperature=0)
        assert status == 200
        answers.append(body["choices"][0]["message"]["content"])
        if cache.hits == hits:
            return False
        assert stack.finished("sim") == served, "a hit never reaches the engine"
        return True

    assert await eventually(hit, timeout=10)
    assert len(answers) >= 2 and answers[-1] in answers[:-1], "a hit replays a stored answer"
    assert secured.log.new() == []


async def test_usage_is_metered_and_reported(secured):
    since = datetime.now(UTC) - timedelta(minutes=1)
    ids = set()
    for i in range(2):
        status, body = await secured.chat("beta", f"meter me {i}")
        assert status == 200
        ids.add(body["id"].removeprefix("chatcmpl-"))
    ops = await secured.connect("ops")
    try:

        async def metered() -> bool:  # workers meter what they serve, the broker its cache hits
            records = [u async for u in read_usage(ops.jetstream(), S, "beta", since, idle_timeout=2)]
            return ids <= {u.request_id for u in records} and any(u.cached for u in records)

        assert await eventually(metered, timeout=15)
    finally:
        await ops.close()
    registry = secured.stack.broker.metrics.registry  # the broker counts each record it reads
    assert (
        registry.get_sample_value(
            "laneway_usage_requests_total", {"tenant": "beta", "model": "laneway-sim", "cached": "true"}
        )
        >= 1
    )
    report = await asyncio.to_thread(
        secured.laneway, "usage", "--tenant", "beta", "--since", since.isoformat(), "--csv"
    )
    assert report.returncode == 0, report.stderr
    total = report.stdout.strip().splitlines()[-1].split(",")
    assert total[0] == "total" and int(total[1]) >= 3 and int(total[2]) >= 1
    assert secured.log.new() == []


async def test_quota_slots_come_back_and_the_rate_limit_holds(secured, monkeypatch):
    # All four requests in one minute window: its edge is 55 s away, not wherever the real clock is.
    monkeypatch.setattr(secured.stack.broker.gate.quota, "_clock", Clock.early_in_this_minute())
    ledger = secured.stack.broker.gate.ledger
    for i in range(3):  # one slot: each request is admitted only once the last one's usage freed it
        status, body = await secured.chat("tight", f"one at a time {i}")
        assert status == 200, body
        request_id = body["id"].removeprefix("chatcmpl-")
        assert await eventually(lambda rid=request_id: ledger.get("tight", rid) is None, timeout=10)
    status, body = await secured.chat("tight", "one too many")
    assert status == 429 and body["error"]["code"] == "rate_limit_exceeded"
    assert secured.log.new() == []


async def test_pii_findings_are_audited(secured):
    status, _ = await secured.chat("alpha", "Call me on 212-555-0134 please")
    assert status == 200
    ops = await secured.connect("ops")
    try:
        sub = await ops.jetstream().subscribe(S.audit("alpha"), stream=S.audit_stream, ordered_consumer=True)
        msg = await sub.next_msg(timeout=10)  # alpha's only prompt with PII
        assert b"PHONE_NUMBER" in msg.data and b"212-555-0134" not in msg.data
        await sub.unsubscribe()
    finally:
        await ops.close()
    assert secured.log.new() == []


async def test_stored_responses_under_the_bridges_user(secured):
    """Store (the bucket the bridge creates), read, continue, list, a conversation, run in the
    background, delete; ops reads it."""
    headers = {"Authorization": f"Bearer {KEYS['alpha']}"}
    async with aiohttp.ClientSession(base_url=secured.stack.url, headers=headers) as http:

        async def post(**body) -> dict:
            async with http.post("/v1/responses", json={"model": "laneway-sim", "max_output_tokens": 3, **body}) as r:
                assert r.status == 200, await r.text()
                return await r.json()

        async def status(method: str, path: str) -> int:
            async with http.request(method, path) as r:
                return r.status

        first = await post(input="Call me on 212-555-0134")
        assert await eventually(lambda: _ok(status("GET", f"/v1/responses/{first['id']}")))
        second = await post(input="again", previous_response_id=first["id"])
        assert await eventually(lambda: _ok(status("GET", f"/v1/responses/{second['id']}")))
        assert await status("GET", f"/v1/responses/{first['id']}/input_items") == 200
        async with http.post("/v1/conversations", json={}) as r:
            conversation = (await r.json())["id"]
        await post(input="in a conversation", conversation=conversation)

        async def appended() -> bool:
            async with http.get(f"/v1/conversations/{conversation}/items") as r:
                return len((await r.json())["data"]) == 2

        assert await eventually(appended)
        background = await post(input="later", background=True)

        async def ended() -> bool:
            async with http.get(f"/v1/responses/{background['id']}") as r:
                return (await r.json())["status"] == "incomplete"  # its 3 tokens were generated

        assert await eventually(ended)
        ops = await secured.connect("ops")
        try:
            stored = await ops.jetstream().get_last_msg("KV_lw_responses", f"$KV.lw_responses.alpha.{first['id']}")
        finally:
            await ops.close()
        assert b"PHONE_NUMBER" in stored.data and b"212-555-0134" not in stored.data
        assert await status("DELETE", f"/v1/responses/{first['id']}") == 200
        assert await status("GET", f"/v1/responses/{first['id']}") == 404
    assert secured.log.new() == []


async def _ok(status) -> bool:
    return await status == 200


async def dead_letters(ops, reason: str) -> list:
    """DLQ records with this reason, read as `ops`."""
    sub = await ops.jetstream().subscribe(S.dlq_all, stream=S.dlq_stream, ordered_consumer=True)
    found = []
    try:
        while True:
            try:
                msg = await sub.next_msg(timeout=1)
            except nats.errors.TimeoutError:
                return found
            if msg.headers.get("Laneway-Reason") == reason:
                found.append(msg)
    finally:
        await sub.unsubscribe()


async def test_poison_malformed_and_abandoned_requests_land_in_the_dlq(secured):
    alpha = await secured.tenant("alpha")
    ops = await secured.connect("ops")
    try:
        async with LanewayClient(alpha, "alpha") as client:
            # Worker path: the engine fails on every attempt; the last one dead-letters it.
            with pytest.raises(LanewayError) as err:
                await asyncio.wait_for(client.generate(chat("POISON", max_tokens=256)).__anext__(), 30)
            assert err.value.code == "engine_error"
            # Broker path: bytes that are no request, published by a tenant as itself.
            await alpha.jetstream().publish(S.req("interactive", "alpha"), b"\x93not a request")
            # Advisory path: a "worker" takes the request and vanishes, every delivery.
            models = dict(settings().models)
            await put_models(ops.jetstream(), S, {**models, "doomed": LogicalModel(pool="doomed")})
            assert await eventually(lambda: "doomed" in secured.stack.broker.live.models, timeout=10)
            doomed = await secured.connect("worker")
            try:
                task = asyncio.create_task(client.generate(chat("hi", model="doomed", max_tokens=256)).__anext__())
                credit = codec.encode(
                    Credit(
                        worker_id="doomed", pool="doomed", free_slots=1, token_budget=10**6, total_slots=1, wait_s=1.0
                    )
                )
                taken, deadline = 0, time.monotonic() + 30
                while taken < 2 and time.monotonic() < deadline:  # never acked: redelivered
                    reply = await doomed.request(S.pull("doomed"), credit, timeout=5)
                    taken += len(codec.decode_batch(reply.data).dispatches)
                assert taken == 2
                with pytest.raises(LanewayError) as abandoned:
                    await asyncio.wait_for(task, 15)
                assert abandoned.value.code == "engine_error"
            finally:
                await doomed.close()
                await put_models(ops.jetstream(), S, models)  # a pool with no worker is not ready
        for reason in ("engine_error", "malformed", "max_deliver"):
            assert await eventually(lambda r=reason: dead_letters(ops, r), timeout=10), reason
    finally:
        await alpha.close()
        await ops.close()
    assert secured.log.new() == []


async def test_routing_admin_rules_apply_live_and_cascade(secured):
    stack = secured.stack
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    async with aiohttp.ClientSession(base_url=stack.url, headers=headers) as http:
        async with http.post("/v1/admin/routing", json={"rules": RULES, "force_reason": "auth test"}) as resp:
            assert resp.status == 200, await resp.text()
            version = (await resp.json())["version"]
        async with http.get("/v1/admin/routing/history") as resp:
            assert resp.status == 200 and (await resp.json())["current"] == version
    assert await eventually(
        lambda: (
            stack.broker.live.rules is not None
            and stack.bridge.rules is not None
            and stack.broker.live.rules.version == version
        ),
        timeout=10,
    )
    large = stack.finished("large")
    status, _ = await secured.chat("beta", "HARD question", model="auto")
    assert status == 200 and stack.finished("large") == large + 1, "escalated by the small worker"
    user, password = secured.auth.services["ops"]
    async with connect_store(secured.server.url, "lw", user, password) as store:  # `laneway routing`
        assert (await store.get_current()).version == version
        rolled = await store.rollback(version, "ops", "auth test")
    assert await eventually(lambda: stack.broker.live.rules.version == rolled.version, timeout=10)
    assert secured.log.new() == []


async def test_classes_and_tenants_change_live_through_the_ops_user(secured):
    live = secured.stack.broker.live
    result = await asyncio.to_thread(secured.laneway, "classes", "set", "batch", "--max-slot-share", "0.5")
    assert result.returncode == 0, result.stderr
    result = await asyncio.to_thread(secured.laneway, "tenants", "set", "beta", "--weight", "4")
    assert result.returncode == 0, result.stderr
    assert await eventually(
        lambda: live.classes["batch"].max_slot_share == 0.5 and live.tenants.weight("beta") == 4, timeout=10
    )
    listed = await asyncio.to_thread(secured.laneway, "tenants", "list")
    assert listed.returncode == 0 and '"beta"' in listed.stdout
    assert secured.log.new() == []


async def test_a_restart_with_new_limits_keeps_working_under_the_same_users(secured):
    stack, secured.stack = secured.stack, None
    await stack.__aexit__(None, None, None)
    await secured.server.stop()
    # `laneway up` again on the same data dir: the same users, streams and buckets updated in place.
    assert up_auth(S, list(KEYS), secured.root) == secured.auth
    await secured.server.start()
    limits = StreamLimits(max_deliver=3, ack_wait_s=3.0, max_msgs_per_subject=500)
    async with secured.make_stack(limits=limits, cache_ttl_s=600.0, pii="off") as secured.stack:
        status, _ = await secured.chat("beta", "after the restart")
        assert status == 200
    secured.stack = None
    refused = [line for line in secured.log.all() if 'user:tenant-alpha"' not in line]
    assert refused == []
