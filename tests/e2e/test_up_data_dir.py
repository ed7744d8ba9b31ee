"""`laneway up`'s data dir has one owner and tells the operator commands where the stack is
(issues 35 and 37): a second `up` on it is refused at once, naming the first, and changes
nothing; a SIGKILLed `up`'s data dir starts again, on the same NATS port; the operator commands
run beside it with no NATS flag and no environment."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import openai
import pytest

from core.ports import free_port
from loadtest.processes import LanewayUp, pids_mentioning
from tests.wait import eventually

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(sys.platform != "linux", reason="flock, and /proc for the processes"),
]

KEY = "sk-data-dir"
ROOT = Path(__file__).resolve().parents[2]
HANG_S = 120  # a bound on a hang, not a window the behaviour must fit in
KEPT = b"what the first run stored\n"


def bare_env() -> dict[str, str]:
    """No LANEWAY_* variable: nothing tells a command where NATS is. This checkout's code first
    on the path, since the commands run from another directory."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LANEWAY_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    return env


async def laneway(*argv: str, cwd: Path) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "laneway.cli",
        *argv,
        cwd=cwd,
        env=bare_env(),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), HANG_S)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        pytest.fail(f"`laneway {' '.join(argv)}` still running after {HANG_S}s")
    return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")


async def store_some(up: LanewayUp) -> tuple[str, str]:
    """(a stored response's id, a file's id) of the demo tenant."""
    async with openai.AsyncOpenAI(base_url=f"{up.url}/v1", api_key=KEY, max_retries=0) as client:
        response = await client.responses.create(model="laneway-sim", input="Keep me.", max_output_tokens=4)
        assert response.output_text
        file = await client.files.create(file=("kept.txt", KEPT), purpose="user_data")
        return response.id, file.id


async def still_stored(up: LanewayUp, kept: tuple[str, str]) -> bool:
    response_id, file_id = kept
    async with openai.AsyncOpenAI(base_url=f"{up.url}/v1", api_key=KEY, max_retries=0) as client:
        return (await client.responses.retrieve(response_id)).id == response_id and (
            await client.files.content(file_id)
        ).content == KEPT


async def test_a_second_up_on_a_data_dir_is_refused_and_the_first_keeps_its_data(tmp_path):
    data = tmp_path / "lw"
    async with LanewayUp(data, KEY, ["--pii", "off", "--sim-profile", "zero"]) as first:
        kept = await store_some(first)
        before = {p: p.read_bytes() for p in data.iterdir() if p.is_file()}
        port = free_port()
        code, out, err = await laneway(
            "up", "--data-dir", str(data), "--port", str(port), "--api-key", "sk-another", "--pii", "off", cwd=tmp_path
        )
        assert code != 0 and "Laneway is up" not in out, (code, out, err)
        assert f"pid {first.proc.pid}" in err and first.url in err and first.nats_url in err, err
        # It changed nothing: not the key, the settings, the credentials; no second nats-server.
        assert {p: p.read_bytes() for p in data.iterdir() if p.is_file()} == before
        assert len(first.role_pids("nats-server")) == 1
        assert pids_mentioning(f"--port {port}") == []
        # The first still serves, and still has what it stored.
        assert await still_stored(first, kept)
        assert await store_some(first)


async def test_a_killed_up_starts_again_on_its_port_and_the_ops_commands_find_it(tmp_path):
    """The data dir is `.laneway` in the commands' directory: the default, so no flag names it."""
    data = tmp_path / ".laneway"
    extra = ["--pii", "off", "--sim-profile", "zero"]
    async with LanewayUp(data, KEY, extra) as first:
        kept = await store_some(first)
        nats_url = first.nats_url
        first.proc.kill()  # SIGKILL: no clean-up of its own; its children get SIGTERM
        await first.proc.wait()
    # At once, while its children may still be stopping: it waits for them, then starts.
    async with LanewayUp(data, KEY, extra) as again:
        assert again.nats_url == nats_url  # the same port: a URL noted before still works
        assert await still_stored(again, kept)
        # `laneway usage` and `laneway classes`: no --nats-url, no --data-dir, no LANEWAY_* set.
        usage: list[str] = []

        async def metered() -> bool:
            code, out, err = await laneway("usage", "--tenant", "demo", "--since", "2020-01-01", cwd=tmp_path)
            usage[:] = [str(code), out, err]
            return code == 0 and "laneway-sim" in out

        assert await eventually(metered, timeout=HANG_S), usage
        code, out, err = await laneway("classes", "list", cwd=tmp_path)
        assert code == 0 and '"interactive"' in out, (code, out, err)
        # `laneway files`: the bridge's URL from the data dir too (its port is not the default).
        code, out, err = await laneway("files", "list", cwd=tmp_path)
        assert code == 0 and kept[1] in out, (code, out, err)


async def test_with_no_stack_and_no_url_the_ops_commands_say_how_to_fix_it(tmp_path):
    code, _out, err = await laneway("usage", "--tenant", "demo", "--since", "2020-01-01", cwd=tmp_path)
    assert code != 0
    assert "laneway up" in err and "--nats-url" in err and "LANEWAY_NATS_URL" in err, err
    assert str(tmp_path / ".laneway") in err, err  # the data dir it looked in
