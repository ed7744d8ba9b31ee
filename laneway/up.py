"""`laneway up`: the whole system on one machine, one command, no Docker.

An embedded nats-server (JetStream on disk under --data-dir), provisioned in this process
(streams, buckets, the settings file into KV: core/provision.py), then broker, worker and bridge
as child processes, exactly as they run in production (each `laneway <role> --nats-url ...`);
`--brokers N` and `--workers N` start several of those two, each kept and restarted alone.
Children run in their own sessions so Ctrl-C reaches only this process, which stops them in
order (bridge, worker, broker, nats-server) and leaves nothing behind. Once the stack is ready,
a child that dies is restarted with backoff (laneway/supervise.py) and the others run on; each
child is tied to this process's life, so a SIGKILL of `up` leaves no orphan either.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from pathlib import Path

import aiohttp
from nats.errors import Error as NatsError

from core import env
from core.connect import NatsSettings
from core.lifetime import end_group, tied_to_this_process
from core.natsd import NatsServer
from core.owner import DirInUse, Owner, OwnerLock
from core.policy.tenants import Tenant, hash_key
from core.ports import free_port, port_taken
from core.provision import provision_at
from core.settings import BadSettings, LogicalModel, Settings, load_serving_settings
from core.tasks import pause
from laneway import scrape_config, stack_dir
from laneway.banner import banner
from laneway.flags import stream_limits
from laneway.nats_config import UpAuth, up_auth
from laneway.supervise import Supervisor
from laneway.up_flags import instances, metrics_argv, subject_prefix, worker_argvs
from laneway.up_keys import bridge_secrets, demo_key, settings_key, settings_toml
from schemas.subjects import Subjects

STOP_GRACE_S = 20.0
NATS_HOST = "127.0.0.1"  # the embedded nats-server listens on loopback only


def _engine_defaults(args: argparse.Namespace) -> tuple[str, str]:
    """(logical model name, pool) for the engine being started."""
    if args.engine == "vllm":
        name = args.model_name or (Path(args.model).name if args.model else "vllm")
        return name, args.pool or "vllm"
    if args.engine == "openai":
        return args.model_name or "hosted", args.pool or "hosted"
    return args.model_name or "laneway-sim", args.pool or "sim"


async def _spawn(
    role: str,
    argv: list[str],
    log_dir: Path,
    auth: UpAuth | None,
    owned: OwnerLock,
    name: str | None = None,
    secrets_env: dict[str, str] | None = None,
) -> asyncio.subprocess.Process:
    """`name` tells apart several children of one role (`broker-2`): their logs and restarts.
    Each holds the data dir's lock too, so it stays owned until the last child has ended."""
    child_env = env.child(secrets_env)
    if auth is not None:  # in the environment, not argv, where any local user could read it
        child_env[env.NATS_USER.name], child_env[env.NATS_PASSWORD.name] = auth.services[role]
    with open(log_dir / f"{name or role}.log", "ab") as log:  # the child keeps its own copy
        return await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "laneway.cli",
            role,
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
            preexec_fn=tied_to_this_process(),
            env=child_env,
            pass_fds=(owned.fd,),
        )


async def _stop(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is not None:
        return  # reaped before (by the supervisor, which ended its group): its pid may be another's now
    proc.send_signal(signal.SIGTERM)
    try:
        async with asyncio.timeout(STOP_GRACE_S):
            await proc.wait()
    except TimeoutError:
        proc.kill()
        await proc.wait()
    end_group(proc.pid)  # killed past its grace, it could not stop its own children


async def _wait_ready(
    url: str, procs: dict[str, asyncio.subprocess.Process], timeout: float, brokers: int, pool: str, workers: int
) -> dict:
    """Until the bridge is ready and has heard from every broker and worker started (each serves
    its metrics before it beats, so the banner's processes all answer); the bridge's `/readyz`,
    from this bridge (its pid), never from another server that answers on the same port."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    async with aiohttp.ClientSession() as http:
        while loop.time() < deadline:
            for role, proc in procs.items():
                if proc.returncode is not None:
                    raise ChildFailed(role, f"{role} exited with {proc.returncode} during start-up")
            try:
                async with http.get(f"{url}/readyz") as resp:
                    state = await resp.json()
                    if (
                        resp.status == 200
                        and state.get("pid") == procs["bridge"].pid
                        and state["brokers"] >= brokers
                        and state["pools"].get(pool, 0) >= workers
                    ):
                        return state
            except aiohttp.ClientError:
                pass
            await pause(0.25)
    raise RuntimeError(f"not ready after {timeout:.0f}s")


class ChildFailed(RuntimeError):
    def __init__(self, name: str, message: str) -> None:
        super().__init__(message)
        self.name = name


def log_tail(log_dir: Path, name: str, lines: int = 4) -> str:
    """A child's last log lines, indented: why it failed, on the terminal that started it."""
    try:
        text = (log_dir / f"{name}.log").read_text(errors="replace")
    except OSError:
        return ""
    tail = [line for line in text.splitlines() if line.strip()][-lines:]
    return "".join(f"\n  {name}.log: {line[:300]}" for line in tail)


async def up(args: argparse.Namespace, forwarded: dict[str, list[str]]) -> int:
    """The data dir is owned before anything in it is read or written, and until the end."""
    data_dir, url = Path(args.data_dir).resolve(), f"http://{args.host}:{args.port}"
    try:
        owned = await stack_dir.claim(data_dir, url)
    except DirInUse as exc:
        print(
            f"laneway up: {exc}: stop it first (Ctrl-C in its terminal), or choose another --data-dir", file=sys.stderr
        )
        return 2
    try:
        return await _up(args, forwarded, data_dir, url, owned)
    finally:
        owned.release()


async def _up(
    args: argparse.Namespace, forwarded: dict[str, list[str]], data_dir: Path, url: str, owned: OwnerLock
) -> int:
    log_dir = data_dir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    model, pool = _engine_defaults(args)
    overwrite = False  # the settings file over KV (a new demo key), this run only
    if args.settings:
        settings_path = Path(args.settings)
        try:
            settings = load_serving_settings(settings_path)
        except BadSettings as exc:
            print(f"laneway up: {exc}", file=sys.stderr)
            return 2
        api_key, key_note = settings_key(settings_path, settings.tenants, args.api_key)
    else:
        api_key, key_note, changed = demo_key(data_dir, args.api_key)
        overwrite = changed  # provisioning is create-if-absent: a new key must replace the old
        settings = Settings(
            tenants={"demo": Tenant(name="demo", api_key_sha256=[hash_key(api_key)])},
            models={model: LogicalModel(pool=pool)},
        )
        settings_path = data_dir / "settings.toml"
        settings_path.write_text(settings_toml(settings))

    if (taken := port_taken(args.host, args.port)) is not None:
        print(
            f"laneway up: {taken}: another process serves there (a Laneway started before?); "
            "stop it, or choose another --port",
            file=sys.stderr,
        )
        return 2
    if (taken := port_taken(NATS_HOST, args.nats_port)) is not None:
        print(f"laneway up: NATS {taken}: stop what serves there, or choose another --nats-port", file=sys.stderr)
        return 2
    nats_port, moved = stack_dir.nats_port(data_dir, NATS_HOST, args.nats_port)
    if moved:
        print(f"laneway up: {moved}", file=sys.stderr)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)

    auth = (
        None if args.no_nats_auth else up_auth(Subjects(subject_prefix(forwarded)), settings.tenants.values(), data_dir)
    )
    nats = NatsServer(
        data_dir / stack_dir.STORE_DIR,
        host=NATS_HOST,
        port=nats_port,
        config_file=auth.authorization_file if auth else None,
        encryption_key_file=None if args.no_encrypt_at_rest else data_dir / "nats" / "jetstream.key",
    )
    try:
        await nats.start()
    except DirInUse as exc:  # a `laneway nats` on this data dir's store
        print(f"laneway up: {exc}: stop it first, or choose another --data-dir", file=sys.stderr)
        return 2
    owned.update(
        Owner(pid=os.getpid(), url=url, nats_url=nats.url, credentials=str(auth.credentials_file) if auth else "")
    )
    common = ["--nats-url", nats.url]
    bridge_argv = [
        *common,
        "--host",
        args.host,
        "--port",
        str(args.port),
        "--settings",
        str(settings_path),
        *forwarded["bridge"],
    ]
    worker_argv = common + ["--pool", pool, "--engine", args.engine] + forwarded["worker"]
    if args.model:
        worker_argv += ["--model", args.model]
    broker_argv = common + ["--pii", args.pii] + forwarded["broker"]

    def start(role: str, argv: list[str], name: str, secrets_env: dict[str, str] | None = None):
        return lambda: _spawn(role, argv, log_dir, auth, owned, name, secrets_env)

    children = instances("broker", args.brokers) + instances("worker", args.workers)
    ports = {name: free_port() for name in children} if args.metrics else {}
    scrape_file = scrape_config.write(data_dir, scrape_config.up_targets(args.host, args.port, ports))
    starts = {
        name: start("broker", broker_argv + metrics_argv(ports, name), name)
        for name in instances("broker", args.brokers)
    }
    starts |= {
        name: start("worker", argv + metrics_argv(ports, name), name)
        for name, argv in zip(instances("worker", args.workers), worker_argvs(worker_argv, args.workers), strict=True)
    }
    starts["bridge"] = start("bridge", bridge_argv, "bridge", bridge_secrets(data_dir))
    procs: dict[str, asyncio.subprocess.Process] = {}
    supervisor = Supervisor()
    code = 0
    try:
        await _provision(args, forwarded, nats.url, auth, settings, overwrite)
        for name, start_child in starts.items():
            procs[name] = await start_child()
        ready = asyncio.create_task(_wait_ready(url, procs, args.startup_timeout, args.brokers, pool, args.workers))
        stopped = asyncio.create_task(stop.wait())
        await asyncio.wait([ready, stopped], return_when=asyncio.FIRST_COMPLETED)
        if stop.is_set():
            ready.cancel()
            return 130
        state = ready.result()  # raises if start-up failed: a child that dies before it is ready
        # is a configuration error, which restarting would only repeat
        assert nats.process is not None  # started before the children
        supervisor.keep("nats-server", nats.process, _restart_nats(nats))
        for role, proc in procs.items():
            supervisor.keep(role, proc, starts[role])
        counts = {"broker": args.brokers, "worker": args.workers, "bridge": 1}
        print(
            banner(
                url,
                api_key,
                model,
                key_note,
                nats.url,
                log_dir,
                auth,
                counts,
                state.get("pii", {}),
                scrape_file,
                args.metrics,
            ),
            flush=True,
        )
        if "missing" in state.get("pii", {}):
            print(
                f"laneway: ERROR: the PII stage is NOT RUNNING (see {log_dir}/broker.log): tenants whose "
                "policy asks for PII handling are refused with 503 pii_unavailable",
                file=sys.stderr,
                flush=True,
            )
        gave_up = asyncio.create_task(supervisor.gave_up.wait())
        await asyncio.wait([stopped, gave_up], return_when=asyncio.FIRST_COMPLETED)
        gave_up.cancel()
        if supervisor.gave_up.is_set():
            print(
                f"laneway: stopping: {supervisor.why}{log_tail(log_dir, supervisor.failed)}\n"
                f"see the logs in {log_dir}/",
                file=sys.stderr,
            )
            code = 1
    except RuntimeError as exc:
        tail = log_tail(log_dir, exc.name) if isinstance(exc, ChildFailed) else ""
        print(f"laneway: {exc}{tail}\nsee the logs in {log_dir}/", file=sys.stderr)
        code = 1
    finally:
        await supervisor.stop()
        procs.update(supervisor.procs)
        for role in ("bridge", "worker", "broker"):  # each role's children stop together
            await asyncio.gather(*(_stop(proc) for name, proc in procs.items() if name.split("-")[0] == role))
        await nats.stop()
    return code


async def _provision(
    args: argparse.Namespace,
    forwarded: dict[str, list[str]],
    nats_url: str,
    auth: UpAuth | None,
    settings: Settings,
    overwrite: bool,
) -> None:
    """Streams, buckets and the settings file into KV, as the ops user, before any service starts
    (they would wait for it). The stream limits are the broker's flags, as `up` forwards them."""
    limits = stream_limits(args.subcommands["broker"].parse_args(forwarded["broker"]))
    user, password = auth.services["ops"] if auth else (None, None)
    try:
        await provision_at(
            NatsSettings(nats_url, subject_prefix(forwarded), user, password), limits, settings, overwrite=overwrite
        )
    except NatsError as exc:
        raise RuntimeError(f"provisioning failed: {type(exc).__name__}: {exc}") from exc


def _restart_nats(nats: NatsServer):
    """nats-server again on the same port and store: clients reconnect to the URL they know."""

    async def start() -> asyncio.subprocess.Process:
        await nats.start()
        assert nats.process is not None  # started
        return nats.process

    return start
