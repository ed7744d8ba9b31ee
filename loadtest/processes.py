"""Run `laneway up` for a benchmark and account the CPU of every process it started."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

import aiohttp

from core import env as core_env
from core.ports import free_port
from schemas.subjects import service_inbox

_TICK = os.sysconf("SC_CLK_TCK")


def stat_fields(pid: int) -> list[str]:
    """/proc/<pid>/stat after the command name: [0] state, [1] ppid, [11:15] utime, stime,
    cutime, cstime (Linux). OSError if the process is gone."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def cpu_seconds(pid: int) -> float:
    """CPU time of one process, its reaped children's included: a child's CPU moves into its
    parent's cutime/cstime when it is reaped, so one that ends between two samples still counts
    (once: it has left the process list by then)."""
    try:
        fields = stat_fields(pid)
    except OSError:
        return 0.0
    return sum(int(f) for f in fields[11:15]) / _TICK


def parents() -> dict[int, int]:
    """pid → parent pid of every process (Linux /proc)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                found[int(entry.name)] = int(stat_fields(int(entry.name))[1])
            except (OSError, IndexError, ValueError):
                pass
    return found


def ancestors(pid: int, parent_of: dict[int, int]) -> set[int]:
    """pid and the processes above it."""
    found = set()
    while pid > 0 and pid not in found:
        found.add(pid)
        pid = parent_of.get(pid, 0)
    return found


def with_descendants(pids: list[int], parent_of: dict[int, int] | None = None) -> list[int]:
    """`pids` and every process below them: a service's own children (the broker's PII analyzer
    pool) spend CPU on its behalf."""
    children: dict[int, list[int]] = {}
    for pid, ppid in (parent_of if parent_of is not None else parents()).items():
        children.setdefault(ppid, []).append(pid)
    found: set[int] = set()
    todo = list(pids)
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, ()))
    return sorted(found)


def tree_cpu_seconds(pids: list[int], parent_of: dict[int, int] | None = None) -> float:
    """CPU seconds so far of `pids` and everything below them (one read of /proc's parent table
    unless `parent_of` is given)."""
    return sum(cpu_seconds(pid) for pid in with_descendants(pids, parent_of))


def pids_mentioning(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if text in (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def metrics_port(pid: int) -> int | None:
    """The --metrics-port a child of `laneway up --metrics` was given, from its command line."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return None
    return int(argv[argv.index("--metrics-port") + 1]) if "--metrics-port" in argv else None


class LanewayUp:
    """`laneway up` in a subprocess; `cpu()` sums the CPU time of everything it runs."""

    def __init__(self, data_dir: Path, api_key: str, extra: list[str] | None = None) -> None:
        self.data_dir = data_dir.resolve()  # matched in command lines: never a bare relative name
        self.api_key = api_key
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.extra = extra or []
        self.proc: asyncio.subprocess.Process | None = None
        self.nats_url = ""
        self.banner = ""
        self.output: list[str] = []  # what `up` printed after its banner (restarts…)
        self._drain: asyncio.Task | None = None

    async def __aenter__(self) -> LanewayUp:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "laneway.cli",
            "--log-level",
            "WARNING",
            "up",
            "--port",
            str(self.port),
            "--data-dir",
            str(self.data_dir),
            "--api-key",
            self.api_key,
            *self.extra,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        stdout = self.proc.stdout
        assert stdout is not None  # a PIPE
        text = b""
        while b"Ctrl-C stops everything" not in text:
            line = await asyncio.wait_for(stdout.readline(), 600)
            if not line:
                raise RuntimeError(f"laneway up failed:\n{text.decode()}")
            text += line
            if b"  NATS  " in line and not self.nats_url:
                self.nats_url = line.decode().split()[-1]
        self.banner = text.decode(errors="replace")
        # Keep reading: a full pipe would block `up` the next time it says something.
        self._drain = asyncio.create_task(self._read_output(stdout))
        return self

    async def _read_output(self, stdout: asyncio.StreamReader) -> None:
        while line := await stdout.readline():
            self.output.append(line.decode(errors="replace").rstrip())

    def credentials(self, user: str) -> tuple[str, str] | None:
        """(user, password) of a NATS user `up` made: "svc-broker", "svc-worker", "svc-bridge",
        "ops" or "tenant-<name>"; None when it runs NATS without auth. Read from the credentials
        file `up` writes into its data dir before nats-server starts."""
        path = self.data_dir / "nats-credentials.json"
        if not path.exists():
            return None
        return user, json.loads(path.read_text())[user]

    def nats_env(self, user: str) -> dict[str, str]:
        """The environment for a `laneway` process joining this stack as `user`."""
        env = core_env.child()
        user_password = self.credentials(user)
        if user_password is not None:
            env["LANEWAY_NATS_USER"], env["LANEWAY_NATS_PASSWORD"] = user_password
        return env

    async def connect_nats(self, user: str, **kwargs):
        import nats

        user_password = self.credentials(user)
        if user_password is not None:
            kwargs["user"], kwargs["password"] = user_password
            if not user.startswith("tenant-"):  # a service's or ops's replies: its own inbox only
                kwargs.setdefault("inbox_prefix", service_inbox(user))
        return await nats.connect(self.nats_url, **kwargs)

    def role_pids(self, role: str) -> list[int]:
        """The live pids of one child role ("broker", "worker", "bridge", "nats-server")."""
        if role == "nats-server":
            return [pid for pid in pids_mentioning(str(self.data_dir)) if pid in pids_mentioning("nats-server")]
        return pids_mentioning(f"laneway.cli {role} --nats-url {self.nats_url}")

    async def schedulers(self, http) -> list[int]:
        """The brokers whose `laneway_broker_scheduler` gauge reads 1 (`up --metrics` serves it);
        `http` is an aiohttp session. A broker not serving its metrics (restarting) is not one."""
        from core.promtext import parse

        found = []
        for pid in self.role_pids("broker"):
            if (port := metrics_port(pid)) is not None:
                try:
                    async with http.get(f"http://127.0.0.1:{port}/metrics") as resp:
                        if parse(await resp.text()).value("laneway_broker_scheduler") == 1:
                            found.append(pid)
                except aiohttp.ClientConnectionError:
                    continue
        return found

    async def __aexit__(self, *exc: object) -> None:
        if self.proc and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGINT)
            await asyncio.wait_for(self.proc.wait(), 60)
        if self._drain is not None:
            await self._drain

    def pids(self, parent_of: dict[int, int] | None = None) -> list[int]:
        """`up`, nats-server (its store is under data_dir) and broker/worker/bridge (they name the
        NATS URL on their command line); never this process or those above it, which may name
        the data dir too (`--data-dir`), and whose other children are the load generator's."""
        mine = ancestors(os.getpid(), parent_of if parent_of is not None else parents())
        return sorted(set(pids_mentioning(str(self.data_dir)) + pids_mentioning(self.nats_url)) - mine)

    def cpu(self) -> float:
        """CPU seconds so far of everything `up` runs, the services' own children included."""
        parent_of = parents()
        return tree_cpu_seconds(self.pids(parent_of), parent_of)

    def cpu_by_role(self) -> dict[str, float]:
        """CPU seconds so far of each child role and its children, to say where a benchmark's
        CPU went."""
        parent_of = parents()
        return {
            role: tree_cpu_seconds(self.role_pids(role), parent_of)
            for role in ("nats-server", "broker", "worker", "bridge")
        }
