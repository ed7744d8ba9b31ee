"""JetStream encryption at rest (`NatsServer(encryption_key_file=...)`), against the real
nats-server: store files never hold a published value, the same key reads it back after a
restart, and the key is in neither the config file nor the process's argv."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

import nats
import nats.errors
import pytest

from core.natsd import NatsServer, NatsServerError, encryption_key

SECRET = b"SEEDED-AT-REST-4111111111111111"
HEADER_SECRET = "SEEDED-HEADER-536228726"


def files_holding(root: Path, needle: bytes) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]


async def store_one(server: NatsServer, user: str | None = None, password: str | None = None) -> int:
    nc = await nats.connect(server.url, user=user, password=password)
    try:
        js = nc.jetstream()
        await js.add_stream(name="SEALED", subjects=["sealed.>"])
        ack = await js.publish("sealed.one", SECRET, headers={"Laneway-Note": HEADER_SECRET})
        return ack.seq
    finally:
        await nc.close()


async def read_back(server: NatsServer, seq: int, **auth: str) -> tuple[bytes, str]:
    nc = await nats.connect(server.url, **auth)
    try:
        msg = await nc.jetstream().get_msg("SEALED", seq)
        return msg.data, msg.headers["Laneway-Note"]
    finally:
        await nc.close()


async def test_without_a_key_the_store_holds_the_plaintext(tmp_path: Path) -> None:
    """The control: the scan below would find the value if it were there."""
    server = NatsServer(tmp_path / "nats")
    await server.start()
    await store_one(server)
    await server.stop()  # a clean stop writes everything out
    assert files_holding(server.store_dir / "jetstream", SECRET)
    assert files_holding(server.store_dir / "jetstream", HEADER_SECRET.encode())


async def test_encrypted_store_never_holds_the_plaintext_and_restarts_with_its_key(tmp_path: Path) -> None:
    key_file = tmp_path / "keys" / "jetstream.key"
    server = NatsServer(tmp_path / "nats", encryption_key_file=key_file)
    await server.start()
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    key = key_file.read_text().strip()
    if sys.platform == "linux":
        assert key.encode() not in Path(f"/proc/{server.process.pid}/cmdline").read_bytes()
    assert key not in (server.store_dir / "nats-server.conf").read_text()
    seq = await store_one(server)
    await server.stop()

    for needle in (SECRET, HEADER_SECRET.encode(), key.encode()):
        assert files_holding(server.store_dir, needle) == []
    assert "Encryption:" in server.log_file.read_text()

    again = NatsServer(tmp_path / "nats", encryption_key_file=key_file)
    async with again:
        assert key_file.read_text().strip() == key  # kept, not regenerated
        assert await read_back(again, seq) == (SECRET, HEADER_SECRET)


async def test_the_given_config_file_is_included(tmp_path: Path) -> None:
    """An auth file in another directory still applies (include paths are relative)."""
    auth = tmp_path / "etc" / "auth.conf"
    auth.parent.mkdir()
    auth.write_text('authorization { user: "lw", password: "s3cret-pass" }\n')
    server = NatsServer(
        tmp_path / "data" / "nats", config_file=auth, encryption_key_file=tmp_path / "data" / "jetstream.key"
    )
    async with server:
        with pytest.raises(nats.errors.Error, match="Authorization Violation"):
            await nats.connect(server.url, allow_reconnect=False, max_reconnect_attempts=0)
        seq = await store_one(server, user="lw", password="s3cret-pass")
        assert await read_back(server, seq, user="lw", password="s3cret-pass") == (SECRET, HEADER_SECRET)
    assert files_holding(server.store_dir, SECRET) == []


def test_a_weak_or_unquotable_key_is_refused(tmp_path: Path) -> None:
    for bad in ("short", "x" * 40 + '"', "y" * 40 + "\\"):
        key_file = tmp_path / "bad.key"
        key_file.write_text(bad)
        with pytest.raises(NatsServerError):
            encryption_key(key_file)
    digits = tmp_path / "digits.key"
    digits.write_text("1" * 48 + "\n")  # a bare number to nats-server's parser, unless quoted
    assert encryption_key(digits) == "1" * 48
