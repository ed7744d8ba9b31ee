"""The routing admin API on a real aiohttp server over a real nats-server: admin auth apart from
tenant keys, OpenAI-shaped validation errors, the eval gate blocking a bad change, a forced
change with its reason recorded, optimistic concurrency, history and rollback.

The evaluator is the real `results_evaluator` over golden-set answers from two simulated pools
(a small model that misses the hard prompts, a large one that answers all): real functions and
the real scorer, no mock of NATS or HTTP.
"""

from __future__ import annotations

import json
import uuid

import aiohttp
import nats
import pytest
from aiohttp import web

from bridge.admin import AdminConfig, admin_app
from bridge.errors import EdgeError
from core.policy.tenants import hash_key
from core.routing.eval_gate import Completion, GoldenItem, load_golden, results_evaluator, run_pools
from core.routing.store import RuleStore
from schemas.subjects import Subjects

ADMIN_KEY = "lw-admin-" + "a" * 24
TENANT_KEY = "sk-tenant-" + "b" * 24


async def simulated(pool: str, item: GoldenItem) -> Completion:
    if pool == "small" and item.category == "reasoning":
        return Completion("not sure", 20, 2, [-2.5, -2.5])
    return Completion(
        f"Answer:\n{item.reference}" if item.extract == "last_line" else item.reference, 20, 3, [-0.1, -0.1]
    )


def rules_doc(auto: dict[str, float], **extra) -> dict:
    doc = {
        "pools": {
            "small": {"cost_out_per_1m": 0.1},
            "large": {"cost_out_per_1m": 1.2},
            "api": {"hosted": True, "cost_out_per_1m": 6.0},
        },
        "models": ["auto"],
        "rules": [{"rule_id": "auto", "match": {"model": "auto"}, "pools": auto}],
    }
    doc.update(extra)
    return doc


@pytest.fixture(scope="module")
async def server(nats_server):
    nc = await nats.connect(nats_server.url)
    store = await RuleStore.open(nc.jetstream(), Subjects(f"a{uuid.uuid4().hex[:8]}"))
    golden = load_golden()
    evaluator = results_evaluator(golden, await run_pools(golden, ["small", "large", "api"], simulated))

    # A parent app like the bridge's, with its own error middleware, the admin API mounted in it.
    @web.middleware
    async def bridge_errors(request, handler):
        try:
            return await handler(request)
        except EdgeError as exc:
            return exc.response()

    app = web.Application(middlewares=[bridge_errors])
    app.add_subapp("/v1/admin", admin_app(store, evaluator, AdminConfig((hash_key(ADMIN_KEY),))))
    disabled = web.Application()
    disabled.add_subapp("/v1/admin", admin_app(store, evaluator, AdminConfig()))
    runners = []
    urls = []
    for a in (app, disabled):
        runner = web.AppRunner(a)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        urls.append(f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}")
    yield urls[0], urls[1]
    for runner in runners:
        await runner.cleanup()
    await nc.close()


@pytest.fixture(scope="module")
async def http():
    async with aiohttp.ClientSession() as session:
        yield session


def admin(key: str = ADMIN_KEY) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def call(http, method: str, url: str, body: object = None, key: str | None = ADMIN_KEY):
    headers = admin(key) if key else {}
    data = body if isinstance(body, (bytes, str)) or body is None else json.dumps(body)
    async with http.request(method, url, data=data, headers=headers) as response:
        return response.status, await response.json()


def assert_openai_error(doc: dict, type_: str, code: str, param: str | None = None) -> None:
    assert set(doc) == {"error"} and set(doc["error"]) == {"message", "type", "param", "code"}
    assert (doc["error"]["type"], doc["error"]["code"], doc["error"]["param"]) == (type_, code, param)
    assert doc["error"]["message"]


async def test_admin_keys_only(server, http) -> None:
    url, disabled = server
    status, doc = await call(http, "GET", f"{url}/v1/admin/routing", key=None)
    assert status == 401
    assert_openai_error(doc, "authentication_error", "invalid_api_key")
    status, doc = await call(http, "GET", f"{url}/v1/admin/routing", key=TENANT_KEY)
    assert status == 401 and doc["error"]["message"] == "invalid admin key"
    status, doc = await call(http, "GET", f"{disabled}/v1/admin/routing")
    assert status == 401
    assert_openai_error(doc, "authentication_error", "admin_disabled")


async def test_change_gate_force_rollback_history(server, http) -> None:
    url, _ = server
    routing = f"{url}/v1/admin/routing"
    status, doc = await call(http, "GET", routing)
    assert status == 200 and doc == {"version": 0, "rules": None}

    # First rule set: nothing to regress from.
    status, doc = await call(http, "POST", routing, {"rules": rules_doc({"large": 1}, reason="start")})
    assert status == 200 and doc["version"] == 1
    assert doc["gate"]["allowed"] and doc["gate"]["baseline_quality"] is None
    assert doc["rules"]["author"].startswith("admin-")  # who, without the key

    # Deliberately bad: everything to the small pool loses the reasoning prompts (> 1 point).
    bad = {"rules": rules_doc({"small": 1}, author="bob", reason="save money"), "expected_version": 1}
    status, doc = await call(http, "POST", routing, bad)
    assert status == 422
    assert_openai_error(doc, "invalid_request_error", "quality_gate_failed", "rules")
    assert "below baseline 100.00 - 1" in doc["error"]["message"]
    assert (await call(http, "GET", routing))[1]["version"] == 1  # nothing stored

    # Cheaper and as good: what the classifier calls simple goes to small, with the cascade
    # escalating unsure answers to large (the classifier sends one reasoning prompt to small).
    smart = rules_doc({"large": 1})
    smart["rules"].insert(
        0,
        {
            "rule_id": "simple",
            "match": {"model": "auto", "intent": "simple"},
            "pools": {"small": 1},
            "escalate_to": "large",
        },
    )
    no_cascade = json.loads(json.dumps(smart))
    del no_cascade["rules"][0]["escalate_to"]
    status, doc = await call(http, "POST", routing, {"rules": no_cascade, "expected_version": 1})
    assert status == 422  # that one misrouted prompt costs 1.85 points
    status, doc = await call(http, "POST", routing, {"rules": smart, "expected_version": 1})
    assert status == 200 and doc["version"] == 2
    assert not doc["gate"]["forced"] and doc["gate"]["candidate_quality"] >= doc["gate"]["baseline_quality"] - 1
    gate = doc["rules"]["gate"]
    assert gate["candidate_cost"] < gate["baseline_cost"]

    # Forced with a reason: applied, and the reason is recorded with the version.
    forced = dict(bad, expected_version=2, force_reason="large pool lost 3 GPUs; quality dip accepted until Friday")
    status, doc = await call(http, "POST", routing, forced)
    assert status == 200 and doc["version"] == 3 and doc["gate"]["forced"]
    assert doc["rules"]["gate"]["forced_reason"].startswith("large pool lost 3 GPUs")

    # A stale writer is refused.
    status, doc = await call(http, "POST", routing, {"rules": smart, "expected_version": 2})
    assert status == 409
    assert_openai_error(doc, "invalid_request_error", "version_conflict", "expected_version")

    # Roll back to the good version 2: a new version 4 with version 2's rules.
    status, doc = await call(http, "POST", f"{routing}/rollback", {"version": 2, "reason": "GPUs back"})
    assert status == 200 and (doc["version"], doc["rollback_of"]) == (4, 2)
    status, current = await call(http, "GET", routing)
    assert current["version"] == 4 and current["rules"]["rollback_of"] == 2
    assert [r["rule_id"] for r in current["rules"]["rules"]] == ["simple", "auto"]
    status, doc = await call(http, "POST", f"{routing}/rollback", {"version": 77})
    assert status == 404
    assert_openai_error(doc, "invalid_request_error", "version_not_found", "version")

    status, history = await call(http, "GET", f"{routing}/history")
    assert status == 200 and history["object"] == "list" and history["current"] == 4
    assert [v["version"] for v in history["data"]] == [1, 2, 3, 4]
    assert history["data"][2]["gate"]["forced_reason"].startswith("large pool lost")
    assert history["data"][2]["author"].startswith("bob (admin-") and history["data"][3]["rollback_of"] == 2


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"rules": rules_doc({"nope": 1})}, "rules.rules[0].pools.nope", "invalid_rules"),
        ({"rules": rules_doc({"small": 0})}, "rules.rules[0].pools.small", "invalid_rules"),
        (
            {
                "rules": rules_doc(
                    {"small": 1},
                    rules=[{"rule_id": "auto", "pools": {"small": 1}}, {"rule_id": "auto", "pools": {"large": 1}}],
                )
            },
            "rules.rules[1].rule_id",
            "invalid_rules",
        ),
        ({"rules": rules_doc({})}, "rules.rules[0].pools", "invalid_rules"),
        ({"rules": rules_doc({"small": "lots"})}, "rules.rules[0].pools[...]", "invalid_rules"),
        ({"rules": rules_doc({"small": 1}), "expected_version": "one"}, "expected_version", "invalid_request"),
        ({"rulez": {}}, None, "invalid_request"),
        (b"{not json", None, "invalid_request"),
    ],
)
async def test_validation_errors_are_openai_shaped(server, http, body, param, code) -> None:
    url, _ = server
    status, doc = await call(http, "POST", f"{url}/v1/admin/routing", body)
    assert status == 400
    assert_openai_error(doc, "invalid_request_error", code, param)


async def test_unknown_admin_route_is_an_openai_404(server, http) -> None:
    url, _ = server
    status, doc = await call(http, "GET", f"{url}/v1/admin/nothing")
    assert status == 404
    assert_openai_error(doc, "invalid_request_error", "not_found")


def test_admin_keys_come_hashed_from_the_environment() -> None:
    digest = hash_key(ADMIN_KEY)
    config = AdminConfig.parse(f" {digest.upper()} , {hash_key('other')}")
    assert config.authenticate(ADMIN_KEY) == digest and config.authenticate(TENANT_KEY) is None
    assert AdminConfig.parse("").key_sha256 == ()
    with pytest.raises(ValueError, match="LANEWAY_ADMIN_KEY_SHA256"):
        AdminConfig.parse(ADMIN_KEY)  # a raw key, not its hash
