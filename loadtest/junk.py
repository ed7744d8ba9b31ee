"""A tenant's NATS user publishing undecodable requests as fast as its server takes them, in a
process of its own: the attacker is another program, and in the benchmark's own event loop it
would delay the very chats it is measured against (`loadtest.noisy --cases junk`).

    python -m loadtest.junk --nats-url URL --tenant globex --seconds 20 [--user U]   (password: a line on stdin)

Prints one JSON line when done: `sent`, and `permission_errors` (publishes the server refused).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

# Every class token the tenant might name, allowed or not: the server refuses the rest.
CLASSES = ("interactive", "standard", "batch", "j0", "j1", "j2")
BURST = 1_000  # publishes between flushes: the server, not the client's buffer, paces it


async def publish(nats_url: str, user: str | None, password: str | None, tenant: str, seconds: float) -> dict:
    import nats
    import nats.errors

    errors: list[str] = []

    async def on_error(exc: Exception) -> None:
        errors.append(type(exc).__name__)

    nc = await nats.connect(nats_url, user=user, password=password, error_cb=on_error, allow_reconnect=False)
    counts = {"sent": 0}
    loop = asyncio.get_running_loop()
    until = loop.time() + seconds
    try:
        while loop.time() < until:
            for i in range(BURST):
                await nc.publish(f"lw.req.{CLASSES[i % len(CLASSES)]}.{tenant}", b"\xffjunk")
            counts["sent"] += BURST
            try:
                await nc.flush(timeout=5)
            except nats.errors.Error:
                pass
    finally:
        counts["permission_errors"] = len(errors)
        await nc.close()
    return counts


async def run_apart(nats_url: str, user: str | None, password: str | None, tenant: str, seconds: float) -> dict:
    """`publish` in a child process; its counts."""
    args = ["--nats-url", nats_url, "--tenant", tenant, "--seconds", str(seconds)]
    if user is not None:
        args += ["--user", user]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "loadtest.junk", *args, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
    )
    out, _ = await proc.communicate((password or "").encode() + b"\n")  # never on the command line
    if proc.returncode != 0:
        raise RuntimeError(f"the junk publisher exited with {proc.returncode}")
    return json.loads(out.decode().strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nats-url", required=True)
    parser.add_argument("--tenant", required=True)
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--user", default=None)
    args = parser.parse_args()
    password = sys.stdin.readline().strip() or None
    counts = asyncio.run(publish(args.nats_url, args.user, password, args.tenant, args.seconds))
    print(json.dumps(counts), flush=True)


if __name__ == "__main__":
    main()
