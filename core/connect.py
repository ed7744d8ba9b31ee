"""The two ways a Laneway process connects to NATS: a service reconnects forever and logs state
changes; a one-shot command fails fast. Both reply on the inbox prefix the user's permissions
allow (`schemas.subjects.service_inbox`). Both speak TLS where the server requires it (as a
`tls://` URL expects), trusting the CA in `tls_ca` alone, or the system's CAs without it; nats-py
takes the server's word for it, so a `tls://` URL does not by itself refuse a plain-text server."""

from __future__ import annotations

import logging
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import nats
import nats.errors
from nats.aio.client import Client

from schemas.subjects import Subjects, service_inbox

log = logging.getLogger("laneway.nats")


@dataclass(frozen=True)
class NatsSettings:
    url: str = "nats://127.0.0.1:4222"
    prefix: str = "lw"
    user: str | None = None
    password: str | None = None
    tls_ca: str | None = None  # PEM file of the CA to trust, instead of the system's

    @property
    def subjects(self) -> Subjects:
        return Subjects(self.prefix)

    def tls_context(self) -> ssl.SSLContext | None:
        """A context trusting `tls_ca` alone; None leaves nats-py's (the system's CAs)."""
        return ssl.create_default_context(cafile=self.tls_ca) if self.tls_ca else None


async def connect(n: NatsSettings, name: str, *, on_disconnect: Callable[[], None] | None = None) -> Client:
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
        servers=n.url.split(","),
        name=name,
        user=n.user,
        password=n.password,
        tls=n.tls_context(),
        inbox_prefix=service_inbox(n.user),
        max_reconnect_attempts=-1,  # processes outlive server restarts
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


async def connect_once(
    n: NatsSettings, name: str, *, error_cb: Callable[[Exception], Awaitable[None]] | None = None
) -> Client:
    """A command-line tool's connection: one try, no reconnects, so it fails loudly and at once.
    Errors reported asynchronously (a permissions violation) are one log line each; nats-py's
    default would print a traceback, for a refused connection too, which the caller reports."""

    async def error(exc: Exception) -> None:
        log.warning("%s: NATS error: %s", name, exc)

    return await nats.connect(
        servers=n.url.split(","),
        name=name,
        user=n.user,
        password=n.password,
        tls=n.tls_context(),
        inbox_prefix=service_inbox(n.user),
        connect_timeout=5,
        allow_reconnect=False,
        max_reconnect_attempts=1,
        error_cb=error_cb or error,
    )


async def disconnect(nc: Client, *, drain: bool = True) -> None:
    """A service's last step: drain (what it published reaches the server; its subscriptions
    finish their messages), or close where the connection is already down or `drain` is off.
    Never raises: the server may have gone first (a reset socket), and stopping goes on."""
    try:
        await (nc.drain() if drain and nc.is_connected else nc.close())
    except (nats.errors.Error, OSError) as exc:
        log.debug("disconnect: %s", exc)
