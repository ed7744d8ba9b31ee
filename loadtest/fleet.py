"""The system under test: `laneway up` with a settings file (tenants, weights, models) plus extra
simulated workers, as separate processes; metrics scraping and memory per process role.

The first worker of the first pool is `laneway up`'s own; every other worker is started here
with `laneway worker --nats-url ...` against the same nats-server, exactly as a second machine
would join. `laneway up` waits until every configured pool has a ready worker, so the extra
workers start as soon as nats-server listens (its port is chosen here and passed to `up`), and
the fleet is entered once every worker has said it is ready.
"""

from __future__ import annotations

import asyncio
import dataclasses
import signal
import socket
import sys
from pathlib import Path

import aiohttp

from bridge.readiness import Readiness
from core.policy.pii import TenantPiiPolicy
from core.policy.tenants import Tenant, hash_key
from core.ports import free_port
from core.promtext import Scrape, parse
from loadtest.processes import LanewayUp
from loadtest.scenarios import PoolSpec, TenantSpec
from schemas.subjects import Subjects

ROLES = ("nats-server", "bridge", "broker", "worker")


def api_key(tenant: str) -> str:
    return f"sk-loadtest-{tenant}"


def settings_toml(
    tenants: tuple[TenantSpec, ...] | list[TenantSpec],
    pools: tuple[PoolSpec, ...] | list[PoolSpec],
    default_timeout_s: float = 600.0,
) -> str:
    lines = [f"default_timeout_s = {default_timeout_s}", ""]
    for t in tenants:
        classes = ", ".join(f'"{c}"' for c in t.classes)
        lines += [
            f"[tenants.{t.name}]",
            f'api_key_sha256 = ["{hash_key(api_key(t.name))}"]',
            f'default_class = "{t.default_class}"',
            f"classes = [{classes}]",
            f"weight = {float(t.weight)}",
            *t.more,
            "",
        ]
        if not t.pii:
            lines += [f"[tenants.{t.name}.pii]", "enabled = false", ""]
    for model, pool in sorted({(p.model, p.pool) for p in pools}):
        lines += [f'[models."{model}"]', f'pool = "{pool}"', ""]
    for p in pools:  # LoRA adapters on the pool's model (the sim loads any path: it has no weights)
        for name in p.adapters:
            lines += [f'[models."{name}"]', f'pool = "{p.pool}"', f'adapter = "/adapters/{name}"', ""]
    return "\n".join(lines)


def rss_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _role(pid: int) -> str | None:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    words = [a.decode(errors="replace") for a in argv]
    if words and words[0].endswith("nats-server"):
        return "nats-server"
    for role in ("bridge", "broker", "worker"):
        if role in words:
            return role
    return None


async def _port_open(port: int, timeout: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            await asyncio.sleep(0.1)
    raise RuntimeError(f"nats-server did not listen on {port} within {timeout:.0f}s")


class Fleet:
    """async with Fleet(dir, tenants, pools) as fleet: fleet.url, fleet.nats_url, fleet.keys."""

    def __init__(
        self,
        data_dir: Path,
        tenants: tuple[TenantSpec, ...] | list[TenantSpec],
        pools: tuple[PoolSpec, ...] | list[PoolSpec],
        up_flags: list[str] | None = None,
    ) -> None:
        """`up_flags`: more of `laneway up`'s own flags (`--brokers 3`, `--pii off`)."""
        self.data_dir = data_dir
        self.tenants = list(tenants)
        self.pools = list(pools)
        self.up_flags = up_flags or []
        self.keys = {t.name: api_key(t.name) for t in self.tenants}
        self.nats_port = free_port()
        self.nats_url = f"nats://127.0.0.1:{self.nats_port}"
        self.extra: list[asyncio.subprocess.Process] = []
        self.up: LanewayUp | None = None
        self._http: aiohttp.ClientSession | None = None

    @property
    def _started(self) -> LanewayUp:
        if self.up is None:
            raise RuntimeError("enter the Fleet first (async with)")
        return self.up

    @property
    def url(self) -> str:
        return self._started.url

    def describe(self) -> dict:
        return {
            "engine": "sim (SIMULATION: modelled GPU step times, no real model)",
            "pools": [
                {
                    "model": p.model,
                    "pool": p.pool,
                    "profile": p.profile,
                    "workers": p.workers,
                    "speed": p.speed,
                    "max_seqs": p.max_seqs,
                    "kv_tokens": p.kv_tokens,
                }
                for p in self.pools
            ],
            "tenants": {t.name: t.weight for t in self.tenants},
        }

    async def __aenter__(self) -> Fleet:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        (self.data_dir / "logs").mkdir(exist_ok=True)
        settings = self.data_dir / "loadtest-settings.toml"
        settings.write_text(settings_toml(self.tenants, self.pools))
        first = self.pools[0]
        self.up = LanewayUp(
            self.data_dir,
            self.keys[self.tenants[0].name],
            [
                "--settings",
                str(settings),
                "--nats-port",
                str(self.nats_port),
                "--pool",
                first.pool,
                "--model-name",
                first.model,
                *first.sim_flags(),
                *self.up_flags,
            ],
        )
        starting = asyncio.create_task(self.up.__aenter__())
        try:
            waiting = asyncio.create_task(_port_open(self.nats_port, 60))
            await asyncio.wait([starting, waiting], return_when=asyncio.FIRST_COMPLETED)
            if starting.done() and (failed := starting.exception()) is not None:
                waiting.cancel()
                raise failed
            await waiting
            for pool in self.pools:
                for _i in range(pool.workers - (1 if pool is first else 0)):
                    self.extra.append(await self._spawn_worker(pool, len(self.extra)))
            await starting
            if self.extra:
                await self._workers_ready()
        except BaseException:
            starting.cancel()
            await self._stop_extra()
            await self.up.__aexit__(None, None, None)
            raise
        self._http = aiohttp.ClientSession()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._http is not None:
            await self._http.close()
        await self._stop_extra()
        if self.up is not None:
            await self.up.__aexit__(*exc)

    async def _workers_ready(self, timeout_s: float = 60.0) -> None:
        """Until every pool has all its workers ready, as the bridge counts them (`Readiness`).
        `up` waits for its own worker only, and a run that starts while another is loading meets
        one worker where it asked for several: its first requests all land there."""
        want: dict[str, int] = {}
        for pool in self.pools:
            want[pool.pool] = want.get(pool.pool, 0) + pool.workers
        readiness = Readiness()
        nc = await self._started.connect_nats("svc-bridge")
        try:
            await nc.subscribe(Subjects().worker_events, cb=readiness.on_heartbeat)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout_s
            while any(readiness.ready_pools().get(pool, 0) < n for pool, n in want.items()):
                if loop.time() > deadline:
                    raise RuntimeError(f"workers ready after {timeout_s:.0f}s: {readiness.ready_pools()}, want {want}")
                await nc.publish(Subjects().worker_ping, b"")  # each answers with a heartbeat at once
                await asyncio.sleep(0.2)
        finally:
            await nc.close()

    async def _spawn_worker(self, pool: PoolSpec, n: int) -> asyncio.subprocess.Process:
        log = open(self.data_dir / "logs" / f"extra-worker-{n}.log", "ab")
        try:
            return await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "laneway.cli",
                "--log-level",
                "WARNING",
                "worker",
                "--nats-url",
                self.nats_url,
                "--pool",
                pool.pool,
                "--engine",
                "sim",
                *pool.sim_flags(),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
                env=self._started.nats_env("svc-worker"),
            )  # `up` wrote it before NATS started
        finally:
            log.close()

    async def _stop_extra(self) -> None:
        for proc in self.extra:
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.extra:
            try:
                await asyncio.wait_for(proc.wait(), 40)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        self.extra.clear()

    # -- observation ----------------------------------------------------------------------
    async def scrape(self) -> Scrape:
        """The bridge's /metrics, parsed."""
        assert self._http is not None
        async with self._http.get(f"{self.url}/metrics") as resp:
            return parse(await resp.text())

    async def open_streams(self) -> float:
        return await self.gauge("laneway_open_streams")

    async def gauge(self, name: str) -> float:
        """One unlabelled metric of the bridge's without parsing the whole exposition."""
        assert self._http is not None
        prefix = name.encode() + b" "
        async with self._http.get(f"{self.url}/metrics") as resp:
            async for line in resp.content:
                if line.startswith(prefix):
                    return float(line.split()[1])
        return float("nan")

    def pids(self) -> list[int]:
        return self._started.pids()

    def cpu(self) -> float:
        return self._started.cpu()

    def rss_by_role(self) -> dict[str, int]:
        out = dict.fromkeys(ROLES, 0)
        for pid in self.pids():
            role = _role(pid)
            if role is not None:
                out[role] += rss_bytes(pid)
        return out

    async def set_class(self, policy) -> None:
        """Change a priority class live: its document in the `lw_classes` KV bucket."""
        from core.policy import classes
        from schemas.subjects import Subjects

        nc = await self._started.connect_nats("ops")
        try:
            kv = await nc.jetstream().key_value(Subjects().bucket("classes"))
            await kv.put(policy.name, classes.encode(policy))
        finally:
            await nc.close()
        await asyncio.sleep(0.5)  # the broker's watch applies it

    async def set_weights(self, weights: dict[str, float]) -> None:
        """Change tenants' fair-share weights live, as an operator would: rewrite their
        documents in the `lw_tenants` KV bucket, which the broker watches."""
        from core.topology import put_tenants
        from schemas.subjects import Subjects

        docs = []
        for i, t in enumerate(self.tenants):
            if t.name in weights:
                self.tenants[i] = t = dataclasses.replace(t, weight=weights[t.name])
                docs.append(
                    Tenant(
                        name=t.name,
                        api_key_sha256=[hash_key(self.keys[t.name])],
                        default_class=t.default_class,
                        classes=list(t.classes),
                        weight=t.weight,
                        pii=TenantPiiPolicy(enabled=t.pii),
                    )
                )
        nc = await self._started.connect_nats("ops")
        try:
            await put_tenants(nc.jetstream(), Subjects(), docs)
        finally:
            await nc.close()
        await asyncio.sleep(0.5)  # the broker's watch applies it
