"""The two ways a Laneway process connects to NATS: a service reconnects forever and logs state
changes; a one-shot command fails fast. Both reply on the inbox prefix the user's permissions
allow (`schemas.subjects.service_inbox`)."""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import nats
from nats.aio.client import Client

from schemas.subjects import Subjects, service_inbox

log = logging.getLogger("laneway.nats")


@dataclass(frozen=True)
class NatsSettings:
    url: str = "nats://127.0.0.1:4222"
    prefix: str = "lw"
    user: str | None = None
    password: str | None = None

    @property
    def subjects(self) -> Subjects:
        return Subjects(self.prefix)

    @classmethod
    def from_env(cls) -> "NatsSettings":
        return cls(url=os.environ.get("LANEWAY_NATS_URL", cls.url), prefix=os.environ.get("LANEWAY_PREFIX", cls.prefix),
                   user=os.environ.get("LANEWAY_NATS_USER"),
                   password=os.environ.get("LANEWAY_NATS_PASSWORD"))


def add_nats_flags(parser: "argparse.ArgumentParser") -> None:
    """--nats-url, --prefix, --nats-user, --nats-password; defaults from the environment."""
    env = NatsSettings.from_env()
    g = parser.add_argument_group("NATS")
    g.add_argument("--nats-url", default=env.url, help="server URL(s), comma-separated [LANEWAY_NATS_URL]")
    g.add_argument("--prefix", default=env.prefix, help="subject prefix [LANEWAY_PREFIX]")
    g.add_argument("--nats-user", default=env.user, help="[LANEWAY_NATS_USER]")
    g.add_argument("--nats-password", default=env.password, help="[LANEWAY_NATS_PASSWORD]")


def nats_from_args(args: "argparse.Namespace") -> NatsSettings:
    return NatsSettings(url=args.nats_url, prefix=args.prefix, user=args.nats_user,
                        password=args.nats_password)


async def connect(url: str, name: str, user: str | None = None, password: str | None = None, *,
                  on_disconnect: Callable[[], None] | None = None) -> Client:
    """Connect with reconnects forever: Laneway processes outlive nats-server restarts.
    `on_disconnect` lets a process act on the loss (the bridge fails its open streams)."""
    async def disconnected() -> None:
        log.warning("%s: disconnected from NATS", name)
        if on_disconnect is not None:
            on_disconnect()

    async def reconnected() -> None:
        log.info("%s: reconnected to NATS", name)

    async def error(exc: Exception) -> None:
        log.warning("%s: NATS error: %s", name, exc)

    return await nats.connect(
        servers=url.split(","),
        name=name,
        user=user,
        password=password,
        inbox_prefix=service_inbox(user),
        max_reconnect_attempts=-1,      # processes outlive server restarts
        reconnect_time_wait=0.5,
        connect_timeout=5,
        allow_reconnect=True,
        # Publishes are buffered while reconnecting; workers drop token frames instead (the
        # edge has ended those streams already) and buffer only acks and usage records.
        pending_size=64 * 1024 * 1024,
        disconnected_cb=disconnected,
        reconnected_cb=reconnected,
        error_cb=error,
    )


async def connect_once(n: NatsSettings, name: str, *,
                       error_cb: Callable[[Exception], Awaitable[None]] | None = None) -> Client:
    """A command-line tool's connection: one try, no reconnects, so it fails loudly and at once."""
    kwargs = {"error_cb": error_cb} if error_cb is not None else {}
    return await nats.connect(servers=n.url.split(","), name=name, user=n.user, password=n.password,
                              inbox_prefix=service_inbox(n.user), connect_timeout=5,
                              allow_reconnect=False, max_reconnect_attempts=1, **kwargs)
