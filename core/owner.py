"""One owner per directory: an `flock` on a lock file, held for the owner's whole life.

A JetStream store opened by two nats-servers is corrupted (`Filestore ... lmb missing`), and a
data dir shared by two `laneway up`s is two of those. The kernel drops an flock when the last
process holding its open file ends, however it ends, so a SIGKILLed owner never blocks the next
start; an owner hands the file to the processes it starts (`pass_fds`), so the lock lasts until
the last of them has gone, not just the first. The file's contents say who holds it (pid, URLs,
where the credentials are): information for a refusal and for operator commands, never the lock.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import time
from pathlib import Path

import msgspec

from core.tasks import pause

log = logging.getLogger("laneway.owner")


class Owner(msgspec.Struct, omit_defaults=True, kw_only=True):
    """Who holds a directory. New fields get defaults: an older file still reads."""

    pid: int
    url: str = ""  # the bridge's (`laneway up`)
    nats_url: str = ""
    credentials: str = ""  # the file with the ops user's password (`laneway up` with NATS auth)

    def alive(self) -> bool:
        if self.pid <= 0:
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # someone else's process: alive
            return True
        return True

    def describe(self) -> str:
        parts = [f"pid {self.pid}", self.url, f"NATS at {self.nats_url}" if self.nats_url else ""]
        return ", ".join(p for p in parts if p)


_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder(Owner).decode


class DirInUse(RuntimeError):
    """`directory` is held by another owner: `owner` as its lock file says (None: unreadable),
    `alive` whether that pid still runs (False: its children are still finishing)."""

    def __init__(self, lock_file: Path, owner: Owner | None, alive: bool) -> None:
        who = owner.describe() if owner is not None else "a process that has not said who it is"
        if owner is not None and not alive:
            who += f", which has ended; processes it started still hold {lock_file} (`fuser -v` names them)"
        super().__init__(f"{lock_file.parent} is in use by {who}")
        self.directory, self.owner, self.alive = lock_file.parent, owner, alive


def read_owner(path: Path) -> Owner | None:
    """The lock file's contents, None when absent or not (yet) a whole record."""
    try:
        return _decode(path.read_bytes())
    except (OSError, msgspec.DecodeError):
        return None


def held_by(path: Path) -> Owner | None:
    """Who holds the lock at `path` now; None when no one does (a file left by an owner that has
    ended says nothing); pid 0 when one does but has not said who. Probes with a shared lock,
    which excludes no other reader."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        for _ in range(50):  # an owner writing its record: a whole one follows at once
            if (owner := read_owner(path)) is not None:
                return owner
            time.sleep(0.01)
        return Owner(pid=0)
    finally:
        os.close(fd)  # drops the probe's lock, if it got one
    return None


class OwnerLock:
    """The lock on one directory's lock file. `own` it, `update` what it says, `release` it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    @property
    def fd(self) -> int:
        """The open file to hand to child processes (`pass_fds`): they hold the lock too."""
        if self._fd is None:
            raise RuntimeError(f"{self.path}: not owned")
        return self._fd

    def try_own(self, owner: Owner) -> None:
        if self._fd is not None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            holder = read_owner(self.path)
            raise DirInUse(self.path, holder, holder is not None and holder.alive()) from None
        self._fd = fd
        self.update(owner)

    async def own(self, owner: Owner, wait_s: float) -> None:
        """Take the lock, or raise DirInUse at once if a live owner holds it. An owner that has
        ended (SIGKILLed) may leave children finishing their shutdown: for them it waits, up to
        `wait_s`, since starting beside them is what the lock is there to prevent."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        said = False
        while True:
            try:
                return self.try_own(owner)
            except DirInUse as exc:
                if exc.alive or loop.time() >= deadline:
                    raise
                if not said and exc.owner is not None:
                    log.warning(
                        "%s: waiting for the processes of an ended owner (%s) to stop",
                        exc.directory,
                        exc.owner.describe(),
                    )
                    said = True
            await pause(0.1)

    def update(self, owner: Owner) -> None:
        """Say who owns it now. Written over in place (the lock is on this file, so it is never
        replaced); a reader that catches it half-written reads None and looks again."""
        data = _encode(owner)
        os.pwrite(self.fd, data, 0)
        os.ftruncate(self.fd, len(data))

    def release(self) -> None:
        """Drop this process's hold (children it handed the file to keep theirs until they end)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
