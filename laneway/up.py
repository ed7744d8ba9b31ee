"""`laneway up`: the whole system on one machine, one command, no Docker.

An embedded nats-server (JetStream on disk under --data-dir), then broker, worker and bridge as
child processes, exactly as they run in production (each `laneway <role> --nats-url ...`).
Children run in their own sessions so Ctrl-C reaches only this process, which stops them in
order (bridge, worker, broker, nats-server) and leaves nothing behind. If any child dies, the
rest are stopped and the exit code says so.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import signal
import sys
from pathlib import Path

import aiohttp

from broker.config import LogicalModel, Settings
from broker.tenants import Tenant, hash_key
from laneway.natsd import NatsServer

STOP_GRACE_S = 20.0


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


async def _spawn(role: str, argv: list[str], log_dir: Path) -> asyncio.subprocess.Process:
    log = open(log_dir / f"{role}.log", "ab")
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "laneway.cli", role, *argv,
        stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)


async def _stop(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        await asyncio.wait_for(proc.wait(), STOP_GRACE_S)
    except asyncio.TimeoutError:
        proc.kill()
        await proc.wait()


async def _wait_ready(url: str, procs: dict[str, asyncio.subprocess.Process], timeout: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    async with aiohttp.ClientSession() as http:
        while loop.time() < deadline:
            for role, proc in procs.items():
                if proc.returncode is not None:
                    raise RuntimeError(f"{role} exited with {proc.returncode} during start-up")
            try:
                async with http.get(f"{url}/readyz") as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.25)
    raise RuntimeError(f"not ready after {timeout:.0f}s")


def _banner(url: str, api_key: str, model: str, generated: bool, nats_url: str, logs: Path) -> str:
    key_note = "  (generated; pass --api-key to choose one)" if generated else ""
    return f"""
Laneway is up: {url}
  NATS        {nats_url}
  API key     {api_key}{key_note}
  model       {model}
  logs        {logs}/

Stream a reply with curl:
  curl -N {url}/v1/chat/completions \\
    -H "Authorization: Bearer {api_key}" -H "Content-Type: application/json" \\
    -d '{{"model": "{model}", "stream": true, "messages": [{{"role": "user", "content": "Hello!"}}]}}'

Or with the openai client:
  python -c "from openai import OpenAI
c = OpenAI(base_url='{url}/v1', api_key='{api_key}')
for ch in c.chat.completions.create(model='{model}', stream=True,
        messages=[{{'role': 'user', 'content': 'Hello!'}}]):
    print(ch.choices[0].delta.content or '', end='', flush=True)"

Ctrl-C stops everything.
"""


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
    `--ack-wait 10` to the broker and the bridge, `--sim-profile X` to the worker."""
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
    data_dir = Path(args.data_dir).resolve()
    log_dir = data_dir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    model, pool = _engine_defaults(args)
    generated = args.api_key is None
    api_key = args.api_key or f"lw-{secrets.token_urlsafe(24)}"
    if args.settings:
        settings_path = Path(args.settings)
    else:
        settings = Settings(tenants={"demo": Tenant(name="demo", api_key_sha256=[hash_key(api_key)])},
                            models={model: LogicalModel(pool=pool)})
        settings_path = data_dir / "settings.toml"
        settings_path.write_text(_settings_toml(settings))

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)

    nats = NatsServer(data_dir / "nats", port=args.nats_port)
    await nats.start()
    common = ["--nats-url", nats.url]
    procs: dict[str, asyncio.subprocess.Process] = {}
    code = 0
    try:
        procs["broker"] = await _spawn("broker", common + ["--pii", args.pii] + forwarded["broker"], log_dir)
        worker_argv = common + ["--pool", pool, "--engine", args.engine] + forwarded["worker"]
        if args.model:
            worker_argv += ["--model", args.model]
        procs["worker"] = await _spawn("worker", worker_argv, log_dir)
        procs["bridge"] = await _spawn(
            "bridge", common + ["--host", args.host, "--port", str(args.port),
                                "--settings", str(settings_path)] + forwarded["bridge"], log_dir)
        url = f"http://{args.host}:{args.port}"
        ready = asyncio.create_task(_wait_ready(url, procs, args.startup_timeout))
        stopped = asyncio.create_task(stop.wait())
        await asyncio.wait([ready, stopped], return_when=asyncio.FIRST_COMPLETED)
        if stop.is_set():
            ready.cancel()
            return 130
        ready.result()  # raises if start-up failed
        print(_banner(url, api_key, model, generated, nats.url, log_dir), flush=True)
        exits = [asyncio.create_task(p.wait()) for p in procs.values()]
        await asyncio.wait([stopped, *exits], return_when=asyncio.FIRST_COMPLETED)
        for role, proc in procs.items():
            if proc.returncode is not None and not stop.is_set():
                print(f"laneway: {role} exited with {proc.returncode}; see {log_dir}/{role}.log",
                      file=sys.stderr)
                code = 1
    except RuntimeError as exc:
        print(f"laneway: {exc}; see the logs in {log_dir}/", file=sys.stderr)
        code = 1
    finally:
        for role in ("bridge", "worker", "broker"):
            if role in procs:
                await _stop(procs[role])
        await nats.stop()
    return code
