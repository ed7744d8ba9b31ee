"""`laneway up` as a user runs it: one command, streams tokens, Ctrl-C leaves no process behind."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys

import openai
import pytest

from core.ports import free_port
from loadtest.processes import pids_mentioning
from tests.wait import eventually


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc to prove nothing is left behind")
async def test_up_streams_and_stops_cleanly(tmp_path):
    port = free_port()
    data_dir = tmp_path / "lw"
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "laneway.cli",
        "up",
        "--port",
        str(port),
        "--data-dir",
        str(data_dir),
        "--api-key",
        "sk-up-test",
        "--sim-profile",
        "llama-8b-h100",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    banner = b""
    try:
        while b"Ctrl-C stops everything" not in banner:
            line = await asyncio.wait_for(
                proc.stdout.readline(), 300
            )  # a bound on a hang: the PII pool imports Presidio
            assert line, f"laneway up exited early: {banner.decode()}"
            banner += line
        assert f"http://127.0.0.1:{port}".encode() in banner and b"curl -N" in banner
        assert b"export KEY=sk-up-test\n" in banner and b"Bearer $KEY" in banner  # the curl pastes as printed
        client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-up-test")
        stream = await client.chat.completions.create(
            model="laneway-sim", stream=True, max_tokens=8, messages=[{"role": "user", "content": "Hello!"}]
        )
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        assert len(text.split()) == 8
        await client.close()
        # The openai example the banner prints runs as printed.
        example = banner.decode().split("Or with the openai client")[1].split("\n", 1)[1]
        example = example.split("\n\nCtrl-C")[0].strip()
        python, code = example.split(" -c ", 1)
        ran = await asyncio.create_subprocess_exec(
            python, "-c", code.strip('"'), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
        printed, _ = await asyncio.wait_for(ran.communicate(), 60)
        assert ran.returncode == 0 and printed.strip(), printed.decode()
        assert len(pids_mentioning(str(data_dir))) >= 1  # nats-server with its store
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGINT)
        code = await asyncio.wait_for(proc.wait(), 60)
    assert code in (0, 130)
    assert await eventually(lambda: pids_mentioning(str(data_dir)) == []), pids_mentioning(str(data_dir))
    nats_url = next(line for line in banner.decode().splitlines() if "NATS" in line).split()[-1]
    assert pids_mentioning(nats_url) == []


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc to prove nothing is left behind")
async def test_up_runs_nats_with_users_and_the_banner_says_how_to_operate_it(tmp_path):
    """Auth is on by default: an anonymous client is refused, every service runs as its own user
    with no permission violation, and the ops line the banner prints works for `laneway classes`."""
    import nats

    from loadtest.processes import LanewayUp

    async with LanewayUp(tmp_path / "lw", "sk-up-auth", ["--pii", "off"]) as up:
        with pytest.raises(nats.errors.Error, match="Authorization Violation"):
            await nats.connect(up.nats_url, allow_reconnect=False, max_reconnect_attempts=0)
        client = openai.AsyncOpenAI(base_url=f"{up.url}/v1", api_key="sk-up-auth")
        reply = await client.chat.completions.create(
            model="laneway-sim", max_tokens=4, messages=[{"role": "user", "content": "Hello!"}]
        )
        assert reply.usage.completion_tokens == 4
        await client.close()

        # Tenants publish only as themselves, straight onto the subjects.
        demo = await up.connect_nats("tenant-demo", inbox_prefix="_INBOX_demo")
        await demo.publish("lw.req.interactive.someone-else", b"x")
        await demo.flush()
        await demo.close()

        export = next(line for line in up.banner.splitlines() if "LANEWAY_NATS_USER=" in line)
        env = dict(os.environ, **dict(kv.split("=", 1) for kv in export.split()[1:]))
        listed = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "laneway.cli",
            "classes",
            "list",
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await listed.communicate()
        assert listed.returncode == 0 and b'"interactive"' in out, out
    log = (tmp_path / "lw" / "nats" / "nats-server.log").read_text()
    violations = [line for line in log.splitlines() if " Violation - " in line]  # publish/subscribe
    assert violations and all("tenant-demo" in line and "someone-else" in line for line in violations), violations


async def test_a_port_taken_is_said_on_the_terminal_and_nothing_starts(tmp_path):
    """Another server holds the port: `up` says why on stderr and exits non-zero at once, before
    it starts a nats-server or a child (it used to print "up" while curl reached the other)."""
    holder = socket.create_server(("127.0.0.1", 0))
    port = holder.getsockname()[1]
    data_dir = tmp_path / "lw"
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "laneway.cli",
            "up",
            "--port",
            str(port),
            "--data-dir",
            str(data_dir),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), 120)
    finally:
        holder.close()
    assert proc.returncode == 2, (out, err)
    assert f"cannot listen on 127.0.0.1:{port}".encode() in err and b"in use" in err, err
    assert b"Laneway is up" not in out
    assert pids_mentioning(str(data_dir)) == []
