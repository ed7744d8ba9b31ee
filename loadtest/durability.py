"""Benchmark: the durability trade-off of JetStream's `sync_interval`, in ONE run.

By default nats-server fsyncs the file store every 2 minutes: an accepted request survives a
process crash (the OS has the bytes) but not a power loss of an R1 server within that window.
`sync_interval: always` fsyncs every write. Replicas (R3 on a cluster) are the usual way to get
durability without paying fsync per message. This measures what `always` costs per PubAck.

    python -m loadtest.durability [--messages 2000] [--size 6144]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

import nats

from core.natsd import NatsServer
from core.topology import StreamLimits, ensure_topology
from loadtest.stats import ms, summary
from schemas.subjects import Subjects


async def measure(sync: str | None, messages: int, size: int, root: Path) -> dict:
    conf = root / f"{sync or 'default'}.conf"
    conf.write_text(f"jetstream {{ sync_interval: {sync} }}\n" if sync else "")
    server = NatsServer(root / (sync or "default"), config_file=conf)
    await server.start()
    try:
        nc = await nats.connect(server.url)
        js = nc.jetstream()
        await ensure_topology(js, Subjects("lw"), StreamLimits(max_msgs_per_subject=1_000_000))
        payload = b"x" * size
        latencies = []
        start = time.perf_counter()
        for i in range(messages):
            t = time.perf_counter()
            await js.publish("lw.req.standard.bench", payload, headers={"Nats-Msg-Id": f"b:{i}"})
            latencies.append(time.perf_counter() - t)
        elapsed = time.perf_counter() - start
        await nc.close()
        return {"sync_interval": sync or "default (2m)", "puback": summary(latencies), "per_s": messages / elapsed}
    finally:
        await server.stop()


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--size", type=int, default=6144, help="bytes per request (~1.5K tokens)")


def run(args: argparse.Namespace) -> int:
    async def both():
        with tempfile.TemporaryDirectory() as tmp:
            return [await measure(s, args.messages, args.size, Path(tmp)) for s in (None, "always")]

    base, always = asyncio.run(both())
    print(f"JetStream PubAck, one publisher, {args.messages} × {args.size} B, R1 file store")
    for r in (base, always):
        p = r["puback"]
        print(
            f"  sync_interval={r['sync_interval']:<14} p50 {ms(p['p50']):>9}  p99 {ms(p['p99']):>9}  "
            f"{r['per_s']:>7.0f} msg/s"
        )
    print(
        f"  'always' costs {always['puback']['p50'] / base['puback']['p50']:.1f}× the p50 PubAck latency "
        f"and runs at {always['per_s'] / base['per_s']:.2f}× the throughput"
    )
    return 0


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    configure(p)
    sys.exit(run(p.parse_args()))
