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
import secrets
import signal
import sys
from pathlib import Path

import aiohttp
from nats.errors import Error as NatsError

from core import env
from core.connect import NatsSettings
from core.lifetime import end_group, tied_to_this_process
from core.natsd import NatsServer, encryption_key
from core.owner import DirInUse, Owner, OwnerLock
from core.policy.tenants import Tenant, hash_key
from core.ports import free_port, port_taken
from core.provision import provision_at
from core.settings import BadSettings, LogicalModel, Settings, load_serving_settings
from laneway import scrape_config, stack_dir
from laneway.banner import banner
from laneway.flags import DEMO_KEY_FILE, stream_limits
from laneway.nats_config import UpAuth, up_auth, write_private
from laneway.supervise import Supervisor
from schemas.subjects import Subjects

STOP_GRACE_S = 20.0
NATS_HOST = "127.0.0.1"     # the embedded nats-server listens on loopback only


def _settings_toml(settings: Settings) -> str:
    lines = []
    for name, tenant in settings.tenants.items():
        lines += [f"[tenants.{name}]", f"api_key_sha256 = {tenant.api_key_sha256!r}".replace("'", '"'),
                  f'default_class = "{tenant.default_class}"', ""]
    for name, model in settings.models.items():
        lines += [f'[models."{name}"]', f'pool = "{model.pool}"', ""]
    return "\n".join(lines)


def _engine_defaults(args: argparse.Namespace) -> tuple[str, str]:
    """(logical model name, pool) for the engine being started."""
    if args.engine == "vllm":
        name = args.model_name or (Path(args.model).name if args.model else "vllm")
        return name, args.pool or "vllm"
    if args.engine == "openai":
        return args.model_name or "hosted", args.pool or "hosted"
    return args.model_name or "laneway-sim", args.pool or "sim"


async def _spawn(role: str, argv: list[str], log_dir: Path, auth: UpAuth | None, owned: OwnerLock,
                 name: str | None = None, secrets_env: dict[str, str] | None = None) -> asyncio.subprocess.Process:
    """`name` tells apart several children of one role (`broker-2`): their logs and restarts.
    Each holds the data dir's lock too, so it stays owned until the last child has ended."""
    child_env = env.child(secrets_env)
    if auth is not None:    # in the environment, not argv, where any local user could read it
        child_env[env.NATS_USER.name], child_env[env.NATS_PASSWORD.name] = auth.services[role]
    with open(log_dir / f"{name or role}.log", "ab") as log:    # the child keeps its own copy
        return await asyncio.create_subprocess_exec(
            sys.executable, "-m", "laneway.cli", role, *argv,
            stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
            preexec_fn=tied_to_this_process(), env=child_env, pass_fds=(owned.fd,))


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


async def _wait_ready(url: str, procs: dict[str, asyncio.subprocess.Process], timeout: float,
                      brokers: int, pool: str, workers: int) -> dict:
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
                    if (resp.status == 200 and state.get("pid") == procs["bridge"].pid
                            and state["brokers"] >= brokers and state["pools"].get(pool, 0) >= workers):
                        return state
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.25)
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


def _demo_key(data_dir: Path, requested: str | None) -> tuple[str, str, bool]:
    """(the demo tenant's key, a note, whether it differs from the last run's). A generated key
    is kept in the data dir (0600), so `up` again on the same data dir keeps the same key."""
    path = data_dir / DEMO_KEY_FILE
    previous = path.read_text().strip() if path.is_file() else None
    key = requested or previous or f"lw-{secrets.token_urlsafe(24)}"
    if key != previous:
        write_private(path, key + "\n")
    if requested:
        note = ""
    elif previous:
        note = f"  (the last run's, from {path}; pass --api-key to choose one)"
    else:
        note = f"  (generated, kept in {path}; pass --api-key to choose one)"
    return key, note, previous is not None and key != previous


def _settings_key(path: Path, tenants: dict[str, Tenant], api_key: str | None) -> tuple[str, str]:
    """(the key the banner shows, a note): with a settings file the tenants' keys are its own,
    so a key is shown only if --api-key names one of them; never a key that would get 401."""
    if api_key is not None:
        owner = next((t.name for t in tenants.values() if hash_key(api_key) in t.api_key_sha256), None)
        if owner is not None:
            return api_key, f"  (tenant {owner})"
        print(f"laneway: --api-key is not a key of any tenant in {path}: it would get 401",
              file=sys.stderr)
    return "$LANEWAY_API_KEY", f"  (a key of a tenant in {path})"


IDEMPOTENCY_KEY_FILE = "idempotency.key"


def _bridge_secrets(data_dir: Path) -> dict[str, str]:
    """The bridge's HMAC key for Idempotency-Key request ids: made once and kept in the data dir
    (0600) as the JetStream key is, so a restarted bridge maps a client's retry to the same id."""
    return {env.IDEMPOTENCY_SECRET.name: encryption_key(data_dir / IDEMPOTENCY_KEY_FILE)}


def _flag_value(argv: list[str], flag: str) -> str | None:
    """The value `argv` gives `flag` (`--flag X` or `--flag=X`; the last one wins, as in argparse)."""
    value = None
    for i, token in enumerate(argv):
        if token == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif token.startswith(f"{flag}="):
            value = token.split("=", 1)[1]
    return value


def _prefix(forwarded: dict[str, list[str]]) -> str:
    """The subject prefix the children were given, else "lw"."""
    return _flag_value(forwarded["broker"], "--prefix") or env.PREFIX.get()


def instances(role: str, n: int) -> list[str]:
    """The children's names: the role itself when there is one (as before `--brokers N`)."""
    return [role] if n == 1 else [f"{role}-{i}" for i in range(1, n + 1)]


def _metrics_argv(ports: dict[str, int], name: str) -> list[str]:
    """The child's own port for its Prometheus metrics (chosen once: kept across its restarts)."""
    return ["--metrics-port", str(ports[name])] if name in ports else []


def worker_argvs(argv: list[str], n: int) -> list[list[str]]:
    """One argv per worker. Ids are unique: a `--worker-id X` given to `up` becomes X-1, X-2...
    for several workers; without one, each worker draws its own."""
    base = _flag_value(argv, "--worker-id")
    if n == 1 or base is None:
        return [list(argv) for _ in range(n)]
    return [[*argv, "--worker-id", f"{base}-{i}"] for i in range(1, n + 1)]   # the last one wins


ROLES = ("broker", "worker", "bridge")
# Flags that cannot be shared by processes on one host, or that `up` owns (its own nats-server).
_NOT_FORWARDED = {"--metrics-port": "each process needs its own port: run the roles separately "
                                    "(`laneway broker|worker|bridge --metrics-port N`)",
                  "--nats-url": "laneway up runs its own nats-server",
                  "--nats-user": "laneway up runs its own nats-server",
                  "--nats-password": "laneway up runs its own nats-server"}


class FlagError(ValueError):
    pass


def route_flags(tokens: list[str], role_parsers: dict[str, argparse.ArgumentParser]) -> dict[str, list[str]]:
    """Flags `up` does not take itself go to every role whose own command takes them:
    `--ack-wait 10` to the broker (and `up`'s provisioning), `--sim-profile X` to the worker."""
    routed: dict[str, list[str]] = {role: [] for role in role_parsers}
    groups: list[list[str]] = []
    for token in tokens:
        if token.startswith("--") or not groups:
            groups.append([token])
        else:
            groups[-1].append(token)      # a value of the flag before it
    for group in groups:
        flag = group[0].split("=", 1)[0]
        if flag in _NOT_FORWARDED:
            raise FlagError(f"{flag}: {_NOT_FORWARDED[flag]}")
        roles = [role for role, parser in role_parsers.items()
                 if flag in parser._option_string_actions]  # argparse has no public lookup
        if not flag.startswith("--") or not roles:
            raise FlagError(f"unrecognized arguments: {' '.join(group)}")
        for role in roles:
            routed[role] += group
    return routed


async def up(args: argparse.Namespace, forwarded: dict[str, list[str]]) -> int:
    """The data dir is owned before anything in it is read or written, and until the end."""
    data_dir, url = Path(args.data_dir).resolve(), f"http://{args.host}:{args.port}"
    try:
        owned = await stack_dir.claim(data_dir, url)
    except DirInUse as exc:
        print(f"laneway up: {exc}: stop it first (Ctrl-C in its terminal), or choose another --data-dir",
              file=sys.stderr)
        return 2
    try:
        return await _up(args, forwarded, data_dir, url, owned)
    finally:
        owned.release()


async def _up(args: argparse.Namespace, forwarded: dict[str, list[str]], data_dir: Path, url: str,
              owned: OwnerLock) -> int:
    log_dir = data_dir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    model, pool = _engine_defaults(args)
    overwrite = False               # the settings file over KV (a new demo key), this run only
    if args.settings:
        settings_path = Path(args.settings)
        try:
            settings = load_serving_settings(settings_path)
        except BadSettings as exc:
            print(f"laneway up: {exc}", file=sys.stderr)
            return 2
        api_key, key_note = _settings_key(settings_path, settings.tenants, args.api_key)
    else:
        api_key, key_note, changed = _demo_key(data_dir, args.api_key)
        overwrite = changed     # provisioning is create-if-absent: a new key must replace the old
        settings = Settings(tenants={"demo": Tenant(name="demo", api_key_sha256=[hash_key(api_key)])},
                            models={model: LogicalModel(pool=pool)})
        settings_path = data_dir / "settings.toml"
        settings_path.write_text(_settings_toml(settings))

    if (taken := port_taken(args.host, args.port)) is not None:
        print(f"laneway up: {taken}: another process serves there (a Laneway started before?); "
              "stop it, or choose another --port", file=sys.stderr)
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

    auth = None if args.no_nats_auth else up_auth(Subjects(_prefix(forwarded)), settings.tenants.values(), data_dir)
    nats = NatsServer(data_dir / stack_dir.STORE_DIR, host=NATS_HOST, port=nats_port,
                      config_file=auth.authorization_file if auth else None,
                      encryption_key_file=None if args.no_encrypt_at_rest else data_dir / "nats" / "jetstream.key")
    try:
        await nats.start()
    except DirInUse as exc:      # a `laneway nats` on this data dir's store
        print(f"laneway up: {exc}: stop it first, or choose another --data-dir", file=sys.stderr)
        return 2
    owned.update(Owner(pid=os.getpid(), url=url, nats_url=nats.url,
                       credentials=str(auth.credentials_file) if auth else ""))
    common = ["--nats-url", nats.url]
    bridge_argv = [*common, "--host", args.host, "--port", str(args.port), "--settings", str(settings_path), *forwarded["bridge"]]
    worker_argv = common + ["--pool", pool, "--engine", args.engine] + forwarded["worker"]
    if args.model:
        worker_argv += ["--model", args.model]
    broker_argv = common + ["--pii", args.pii] + forwarded["broker"]

    def start(role: str, argv: list[str], name: str, secrets_env: dict[str, str] | None = None):
        return lambda: _spawn(role, argv, log_dir, auth, owned, name, secrets_env)

    children = instances("broker", args.brokers) + instances("worker", args.workers)
    ports = {name: free_port() for name in children} if args.metrics else {}
    scrape_file = scrape_config.write(data_dir, scrape_config.up_targets(args.host, args.port, ports))
    starts = {name: start("broker", broker_argv + _metrics_argv(ports, name), name)
              for name in instances("broker", args.brokers)}
    starts |= {name: start("worker", argv + _metrics_argv(ports, name), name) for name, argv in
               zip(instances("worker", args.workers), worker_argvs(worker_argv, args.workers), strict=True)}
    starts["bridge"] = start("bridge", bridge_argv, "bridge", _bridge_secrets(data_dir))
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
        print(banner(url, api_key, model, key_note, nats.url, log_dir, auth, counts, state.get("pii", {}),
                     scrape_file, args.metrics), flush=True)
        if "missing" in state.get("pii", {}):
            print(f"laneway: ERROR: the PII stage is NOT RUNNING (see {log_dir}/broker.log): tenants whose "
                  "policy asks for PII handling are refused with 503 pii_unavailable", file=sys.stderr, flush=True)
        gave_up = asyncio.create_task(supervisor.gave_up.wait())
        await asyncio.wait([stopped, gave_up], return_when=asyncio.FIRST_COMPLETED)
        gave_up.cancel()
        if supervisor.gave_up.is_set():
            print(f"laneway: stopping: {supervisor.why}{log_tail(log_dir, supervisor.failed)}\n"
                  f"see the logs in {log_dir}/", file=sys.stderr)
            code = 1
    except RuntimeError as exc:
        tail = log_tail(log_dir, exc.name) if isinstance(exc, ChildFailed) else ""
        print(f"laneway: {exc}{tail}\nsee the logs in {log_dir}/", file=sys.stderr)
        code = 1
    finally:
        await supervisor.stop()
        procs.update(supervisor.procs)
        for role in ("bridge", "worker", "broker"):     # each role's children stop together
            await asyncio.gather(*(_stop(proc) for name, proc in procs.items()
                                   if name.split("-")[0] == role))
        await nats.stop()
    return code


async def _provision(args: argparse.Namespace, forwarded: dict[str, list[str]], nats_url: str,
                     auth: UpAuth | None, settings: Settings, overwrite: bool) -> None:
    """Streams, buckets and the settings file into KV, as the ops user, before any service starts
    (they would wait for it). The stream limits are the broker's flags, as `up` forwards them."""
    limits = stream_limits(args.subcommands["broker"].parse_args(forwarded["broker"]))
    user, password = auth.services["ops"] if auth else (None, None)
    try:
        await provision_at(NatsSettings(nats_url, _prefix(forwarded), user, password), limits, settings,
                           overwrite=overwrite)
    except NatsError as exc:
        raise RuntimeError(f"provisioning failed: {type(exc).__name__}: {exc}") from exc


def _restart_nats(nats: NatsServer):
    """nats-server again on the same port and store: clients reconnect to the URL they know."""
    async def start() -> asyncio.subprocess.Process:
        await nats.start()
        assert nats.process is not None  # started
        return nats.process
    return start
