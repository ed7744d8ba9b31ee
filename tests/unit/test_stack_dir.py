"""What `laneway up` keeps in its data dir (laneway/stack_dir.py) and how an operator command
reads it (laneway/flags.py `find_stack`), without starting a stack: the lock's record stands in
for a running `up`, a socket for a taken port."""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from core.owner import DirInUse, Owner, OwnerLock, held_by
from laneway import stack_dir
from laneway.flags import NoNats, find_stack, ops_nats_flags

ROOT = Path(__file__).resolve().parents[2]


def ops_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    ops_nats_flags(parser)
    return parser.parse_args(list(argv))


def test_the_nats_port_is_kept_and_a_taken_one_is_said(tmp_path: Path) -> None:
    first, note = stack_dir.nats_port(tmp_path, "127.0.0.1", 0)
    assert note == "" and (tmp_path / stack_dir.NATS_PORT_FILE).read_text().strip() == str(first)
    assert stack_dir.nats_port(tmp_path, "127.0.0.1", 0) == (first, "")  # kept
    with socket.create_server(("127.0.0.1", first)):
        moved, note = stack_dir.nats_port(tmp_path, "127.0.0.1", 0)
    assert moved != first and f"cannot listen on 127.0.0.1:{first}" in note and str(moved) in note
    assert stack_dir.nats_port(tmp_path, "127.0.0.1", 0) == (moved, "")  # the new one is kept


async def test_a_lock_refuses_a_live_owner_and_frees_with_a_killed_one(tmp_path: Path) -> None:
    path = tmp_path / "owner.lock"
    holder = subprocess.Popen(  # owns it, says so, then waits to be killed
        [
            sys.executable,
            "-c",
            "import asyncio, sys\nfrom pathlib import Path\n"
            "from core.owner import Owner, OwnerLock\n"
            f"lock = OwnerLock(Path({str(path)!r}))\n"
            "asyncio.run(lock.own(Owner(pid=1, url='http://x'), 0))\nprint('owned', flush=True)\nsys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert holder.stdout.readline() == b"owned\n"
        assert held_by(path) == Owner(pid=1, url="http://x")
        with pytest.raises(DirInUse) as refused:
            await OwnerLock(path).own(Owner(pid=os.getpid()), wait_s=0)
        assert "pid 1, http://x" in str(refused.value) and refused.value.alive  # pid 1 runs
    finally:
        holder.kill()
        holder.wait()
    assert held_by(path) is None  # a record left by an ended owner says nothing
    lock = OwnerLock(path)
    await lock.own(Owner(pid=os.getpid()), wait_s=0)
    assert held_by(path) == Owner(pid=os.getpid())
    lock.release()


async def test_an_ops_command_finds_the_stack_on_its_data_dir(tmp_path: Path, monkeypatch) -> None:
    for name in ("LANEWAY_NATS_URL", "LANEWAY_NATS_USER", "LANEWAY_NATS_PASSWORD"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(NoNats, match="laneway up"):
        find_stack(ops_args("--data-dir", str(tmp_path)))
    creds = tmp_path / "nats-credentials.json"
    creds.write_text(json.dumps({"ops": "pw-ops", "svc-bridge": "pw-bridge"}))
    lock = await stack_dir.claim(tmp_path, "http://127.0.0.1:8080")
    lock.update(
        Owner(pid=os.getpid(), url="http://127.0.0.1:8080", nats_url="nats://127.0.0.1:14222", credentials=str(creds))
    )
    try:
        args = ops_args("--data-dir", str(tmp_path))
        find_stack(args)
        assert (args.nats_url, args.nats_user, args.nats_password) == ("nats://127.0.0.1:14222", "ops", "pw-ops")
        args = ops_args("--data-dir", str(tmp_path), "--nats-url", "nats://elsewhere:4222")  # given: wins
        find_stack(args)
        assert (args.nats_url, args.nats_user) == ("nats://elsewhere:4222", None)
        monkeypatch.setenv("LANEWAY_NATS_URL", "nats://from-env:4222")
        args = ops_args("--data-dir", str(tmp_path))
        find_stack(args)
        assert (args.nats_url, args.nats_user) == ("nats://from-env:4222", None)
    finally:
        lock.release()
