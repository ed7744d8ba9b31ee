"""The load generator in K processes of its own, so that it is not the limit of what it measures.

`Swarm` starts K children (`python -m loadtest.swarm`), each an aiohttp client driving its share
of the flows with `run_flows`. The conversation runs over the child's stdin and stdout, one JSON
line at a time:
- parent → child: the job (url, keys, flows, seed, results file), then `stop` when done;
- child → parent: a progress line every `interval_s` (sent, errors, tokens, in flight and waiting
  per flow, streams with a first token), then `done` once its results are written.
On `stop` a child cuts its requests (as a phase end cuts them) and writes every `Result` to its
results file (msgpack; inter-token gaps as packed doubles), which the parent reads back.
"""

from __future__ import annotations

import argparse
import array
import asyncio
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

import msgspec

from loadtest.http_client import Result
from loadtest.processes import cpu_seconds
from loadtest.scenarios import Flow
from loadtest.traffic import HttpTarget, Recorder, Sample, run_flows

_ROW = ("ttft", "e2e", "tokens", "status", "error", "started_at", "klass", "tenant", "flow", "completion_tokens", "cut")


def split(flows: list[Flow], k: int) -> list[list[Flow]]:
    """K shares of the flows: closed-loop users dealt out, open-loop rates divided."""
    shares: list[list[Flow]] = [[] for _ in range(k)]
    for flow in flows:
        for i in range(k):
            if flow.open_loop:
                shares[i].append(dataclasses.replace(flow, rate=flow.rate / k))
            elif users := flow.users // k + (1 if i < flow.users % k else 0):
                shares[i].append(dataclasses.replace(flow, users=users))
    return shares


def _pack(results: list[Result]) -> bytes:
    return msgspec.msgpack.encode(
        [[*(getattr(r, f) for f in _ROW), array.array("d", r.gaps).tobytes()] for r in results]
    )


def _unpack(data: bytes) -> list[Result]:
    out = []
    for row in msgspec.msgpack.decode(data):
        r = Result(**dict(zip(_ROW, row[:-1], strict=True)))
        r.gaps = array.array("d", row[-1]).tolist()
        out.append(r)
    return out


_KINDS = ("inflight", "waiting")  # a Sample's per-flow counts


def _add(into: dict[str, int], counts: dict[str, int]) -> None:
    for flow, n in counts.items():
        into[flow] = into.get(flow, 0) + n


class Tally:
    """The children's progress summed: what `Progress` reads from a `Recorder`."""

    def __init__(self, k: int) -> None:
        self._latest: list[dict] = [{} for _ in range(k)]
        self.samples: list[Sample] = []

    def update(self, child: int, line: dict) -> None:
        self._latest[child] = line

    def _sum(self, key: str) -> int:
        return sum(line.get(key, 0) for line in self._latest)

    @property
    def sent(self) -> int:
        return self._sum("sent")

    @property
    def errors(self) -> int:
        return self._sum("errors")

    @property
    def streaming(self) -> int:
        return self._sum("streaming")

    def tokens(self) -> int:
        return self._sum("tokens")

    def in_flight(self) -> int:
        return sum(sum(line.get("inflight", {}).values()) for line in self._latest)

    def sample(self, open_streams: float | None = None) -> Sample:
        """As `Recorder.sample`, so that `traffic.sampler` samples a swarm too."""
        s = Sample(time.time(), open_streams=open_streams)
        for line in self._latest:
            for kind in _KINDS:
                _add(getattr(s, kind), line.get(kind, {}))
        self.samples.append(s)
        return s


class Joined:
    """A `Recorder` and a swarm's `Tally` read as one by `sampler` and `Progress`: a phase whose
    flows run partly in this process and partly in children."""

    def __init__(self, rec: Recorder, tally: Tally) -> None:
        self.rec, self.tally = rec, tally
        self.samples: list[Sample] = []

    @property
    def sent(self) -> int:
        return self.rec.sent + self.tally.sent

    @property
    def errors(self) -> int:
        return self.rec.errors + self.tally.errors

    def tokens(self) -> int:
        return self.rec.tokens() + self.tally.tokens()

    def sample(self, open_streams: float | None = None) -> Sample:
        s = Sample(time.time(), open_streams=open_streams)
        for part in (self.rec.sample(open_streams), self.tally.sample(open_streams)):
            for kind in _KINDS:
                _add(getattr(s, kind), getattr(part, kind))
        self.samples.append(s)
        return s


class Swarm:
    """async with Swarm(url, keys, flows, procs=K) as swarm: ...; results = await swarm.stop()."""

    def __init__(
        self,
        url: str,
        keys: dict[str, str],
        flows: list[Flow],
        *,
        procs: int,
        workdir: Path,
        seed: int = 1,
        interval_s: float = 0.5,
    ) -> None:
        self.tally = Tally(procs)
        self._jobs: list[dict[str, Any]] = [  # JSON, one per child
            {
                "url": url,
                "keys": keys,
                "flows": [dataclasses.asdict(f) for f in share],
                "seed": seed + i,
                "results": str(workdir / f"swarm-{i}.msgpack"),
                "interval_s": interval_s,
            }
            for i, share in enumerate(split(flows, procs))
        ]
        self._procs: list[asyncio.subprocess.Process] = []
        self._stdins: list[asyncio.StreamWriter] = []  # one per child: its stdin pipe
        self._readers: list[asyncio.Task[None]] = []
        self._done: list[asyncio.Event] = []  # set when a child said `done`, or exited
        self._heard: list[asyncio.Event] = []  # set at a child's first line: its load has begun
        self._finished: set[int] = set()  # the children that said `done`

    async def __aenter__(self) -> Swarm:
        for i, job in enumerate(self._jobs):
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "loadtest.swarm",
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                start_new_session=True,
            )
            if proc.stdin is None or proc.stdout is None:  # asked for both pipes: never
                raise RuntimeError("the load generator process has no pipes")
            proc.stdin.write(json.dumps(job).encode() + b"\n")
            self._procs.append(proc)
            self._stdins.append(proc.stdin)
            self._done.append(asyncio.Event())
            self._heard.append(asyncio.Event())
            self._readers.append(asyncio.create_task(self._read(i, proc.stdout)))
        return self

    async def __aexit__(self, *exc: object) -> None:
        for proc in self._procs:
            if proc.returncode is None:
                proc.kill()
            await proc.wait()
        for task in self._readers:
            task.cancel()
        await asyncio.gather(*self._readers, return_exceptions=True)

    async def _read(self, child: int, stdout: asyncio.StreamReader) -> None:
        while line := await stdout.readline():
            msg = json.loads(line)
            self._heard[child].set()
            if msg.get("done"):
                self._finished.add(child)
            else:
                self.tally.update(child, msg)
        self._heard[child].set()
        self._done[child].set()

    async def started(self, timeout_s: float = 60.0) -> None:
        """Until every child has begun its load (its first progress line), or exited."""
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in self._heard)), timeout_s)

    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    def cpu(self) -> float:
        """CPU seconds the children have used so far."""
        return sum(cpu_seconds(pid) for pid in self.pids())

    async def stop(self, timeout_s: float = 120.0) -> list[Result]:
        """Cut every request and gather every child's results."""
        for proc, stdin in zip(self._procs, self._stdins, strict=True):
            if proc.returncode is None:
                stdin.write(b"stop\n")
                await stdin.drain()
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in self._done)), timeout_s)
        if lost := [i for i in range(len(self._procs)) if i not in self._finished]:
            raise RuntimeError(
                f"load generator processes {lost} exited without their results "
                f"(exit codes {[self._procs[i].returncode for i in lost]})"
            )
        results: list[Result] = []
        for job in self._jobs:
            results += _unpack(Path(job["results"]).read_bytes())
        return results


# -- the child ------------------------------------------------------------------------------
def _progress(rec: Recorder) -> dict:
    s = rec.sample()
    rec.samples.clear()  # the parent keeps the samples
    return {
        "sent": rec.sent,
        "errors": rec.errors,
        "tokens": rec.tokens(),
        "inflight": s.inflight,
        "waiting": s.waiting,
        "streaming": sum(1 for r in rec.results if r.ttft is not None),
    }


async def _child() -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    job = json.loads(await reader.readline())
    flows = [Flow(**f) for f in job["flows"]]
    rec = Recorder()
    out = sys.stdout

    def say(msg: dict) -> None:
        out.write(json.dumps(msg) + "\n")
        out.flush()

    async def report() -> None:
        while True:
            say(_progress(rec))
            await asyncio.sleep(job["interval_s"])

    async with HttpTarget(job["url"], job["keys"]) as target:
        load = asyncio.create_task(run_flows(target, rec, flows, 86400.0, seed=job["seed"]))
        reporting = asyncio.create_task(report())
        await reader.readline()  # "stop", or the parent went away
        load.cancel()
        await asyncio.gather(load, return_exceptions=True)
        reporting.cancel()
        await asyncio.gather(reporting, return_exceptions=True)
    Path(job["results"]).write_bytes(_pack(rec.results))
    say(_progress(rec))
    say({"done": True})


def main() -> None:
    argparse.ArgumentParser(description=__doc__).parse_args()
    from core import heap
    from loadtest.generator import raise_fd_limit

    raise_fd_limit(1 << 20)
    heap.settle()
    try:
        import uvloop
    except ImportError:
        asyncio.run(_child())
    else:
        uvloop.run(_child())


if __name__ == "__main__":
    main()
