"""Benchmark: Laneway beside a peer, LiteLLM's proxy server, in front of the SAME local mock
upstream, in ONE run; a one-process aiohttp pass-through is the floor.

    python -m loadtest.peer [--concurrency 1 32 256] [--requests 200] [--json out.json]

The mock (`loadtest/mock_upstream.py`, its own process) streams 64 tokens for a 6 KB prompt with
no delay, so everything a client waits for beyond the mock driven directly is the proxy's. For
each system and concurrency c (closed loop: c clients send back to back): added TTFT p50/p99 (vs
the mock direct at the same c), req/s and errors, CPU ms per request of ALL its processes
(Laneway: nats-server, broker, worker, bridge; LiteLLM: the proxy and any children; the floor: its
one process). Laneway runs `laneway up --engine openai` with `--pii off` (LiteLLM scans nothing).

LiteLLM runs as its real proxy server (`litellm.proxy.proxy_cli`, uvicorn, 1 worker, a master
key, no database). Its `proxy` extra names `litellm-proxy`, which this machine's index lacks; the
modules the proxy imports are the `peer` extra, or a directory given by --proxy-path that is put
on the proxy's PYTHONPATH only.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from core import env as core_env
from core.ports import free_port
from loadtest.benchcli import main
from loadtest.http_client import Result, stream_chat
from loadtest.overhead import PROMPT, _bounded
from loadtest.processes import LanewayUp, tree_cpu_seconds
from loadtest.stats import ms, summary

KEY = "sk-bench-peer"
LITELLM_KEY = "sk-peer-litellm-master"
MODEL = "mock"
DEFAULT_PROXY_PATH = Path(".cache/litellm-proxy-deps")
SYSTEMS = ("floor", "litellm", "laneway")
LABELS = {
    "direct": "mock upstream direct",
    "floor": "aiohttp pass-through (1 process)",
    "litellm": "LiteLLM proxy server",
    "laneway": "Laneway (up, openai engine)",
}


@dataclass
class Server:
    """One server process; `cpu()` counts it and its children."""

    argv: list[str]
    url: str
    ready_path: str
    env: dict[str, str] | None = None
    proc: asyncio.subprocess.Process | None = None
    log: Path | None = None

    async def __aenter__(self) -> Server:
        with open(self.log or os.devnull, "ab") as out:
            self.proc = await asyncio.create_subprocess_exec(
                *self.argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                start_new_session=True,
                env=self.env,
            )
        deadline = time.monotonic() + 120
        async with aiohttp.ClientSession() as http:
            while time.monotonic() < deadline:
                if self.proc.returncode is not None:
                    tail = self.log.read_text()[-3000:] if self.log else ""
                    raise RuntimeError(f"{self.argv[:4]} exited with {self.proc.returncode}:\n{tail}")
                try:
                    async with http.get(self.url + self.ready_path) as resp:
                        if resp.status < 500:
                            return self
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.2)
        await self.__aexit__()
        raise RuntimeError(f"{self.argv[:4]} did not answer {self.ready_path} within 120 s")

    async def __aexit__(self, *exc: object) -> None:
        if self.proc is None or self.proc.returncode is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(self.proc.wait(), 20)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()

    def cpu(self) -> float:
        assert self.proc is not None
        return tree_cpu_seconds([self.proc.pid])


def _litellm_config(path: Path, upstream: str) -> Path:
    path.write_text(
        "model_list:\n"
        f"  - model_name: {MODEL}\n"
        "    litellm_params:\n"
        f"      model: openai/{MODEL}\n"
        f"      api_base: {upstream}/v1\n"
        "      api_key: sk-mock\n"
        "litellm_settings:\n"
        "  telemetry: false\n"
        "general_settings:\n"
        f"  master_key: {LITELLM_KEY}\n"
    )
    return path


def _litellm(tmp: Path, upstream: str, proxy_path: Path | None) -> Server:
    port = free_port()
    env = core_env.child({"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR", "LITELLM_TELEMETRY": "False"})
    if proxy_path is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(proxy_path.resolve()), env.get("PYTHONPATH")]))
    argv = [
        sys.executable,
        "-m",
        "litellm.proxy.proxy_cli",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--num_workers",
        "1",
        "--config",
        str(_litellm_config(tmp / "litellm.yaml", upstream)),
    ]
    return Server(argv, f"http://127.0.0.1:{port}", "/health/liveliness", env, log=tmp / "litellm.log")


def _module(tmp: Path, name: str, *args: str) -> Server:
    port = free_port()
    argv = [sys.executable, "-m", "loadtest.mock_upstream", *args, "--port", str(port)]
    return Server(
        argv, f"http://127.0.0.1:{port}", "/v1/models" if args[0] == "serve" else "/", log=tmp / f"{name}.log"
    )


async def _drive(url: str, key: str, c: int, n: int, tokens: int) -> tuple[list[Result], float]:
    body = {
        "model": MODEL,
        "max_tokens": tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": PROMPT}],
    }
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        await _bounded(min(c, 8), 16, lambda i: stream_chat(http, url, key, body))  # warm
        t0 = time.perf_counter()
        results = await _bounded(c, n, lambda i: stream_chat(http, url, key, body))
        elapsed = time.perf_counter() - t0
    for r in results:  # an answer cut short is an error too
        if r.ok and r.tokens != tokens:
            r.error = f"short:{r.tokens}"
    return results, elapsed


async def _level(url: str, key: str, c: int, n: int, tokens: int, cpu) -> dict:
    cpu0 = cpu()
    results, elapsed = await _drive(url, key, c, n, tokens)
    used = cpu() - cpu0
    ok = [r for r in results if r.ok]
    errors: dict[str, int] = {}
    for r in results:
        if not r.ok:
            errors[r.error or str(r.status)] = errors.get(r.error or str(r.status), 0) + 1
    return {
        "concurrency": c,
        "requests": n,
        "errors": len(results) - len(ok),
        "error_kinds": errors,
        "ttft": summary([r.ttft for r in ok if r.ttft is not None]),
        "requests_per_s": n / elapsed,
        "cpu_ms_per_request": 1000 * used / n,
    }


async def run_benchmark(args: argparse.Namespace) -> dict:
    proxy_path = args.proxy_path if args.proxy_path and args.proxy_path.is_dir() else None
    doc: dict = {
        "prompt_bytes": len(PROMPT),
        "tokens": args.tokens,
        "levels": args.concurrency,
        "litellm": f"LiteLLM proxy server (litellm {_version('litellm')}, uvicorn, 1 worker)"
        + (f", proxy modules from {proxy_path}" if proxy_path else ""),
        "systems": {},
    }
    levels = [(c, max(args.requests, 2 * c)) for c in args.concurrency]
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        async with _module(tmp, "mock", "serve", "--tokens", str(args.tokens)) as mock:
            doc["systems"]["direct"] = [await _level(mock.url, KEY, c, n, args.tokens, mock.cpu) for c, n in levels]
            async with _module(tmp, "floor", "relay", "--upstream", mock.url) as floor:
                doc["systems"]["floor"] = [
                    await _level(floor.url, KEY, c, n, args.tokens, floor.cpu) for c, n in levels
                ]
            async with _litellm(tmp, mock.url, proxy_path) as litellm:
                doc["systems"]["litellm"] = [
                    await _level(litellm.url, LITELLM_KEY, c, n, args.tokens, litellm.cpu) for c, n in levels
                ]
            extra = [
                "--engine",
                "openai",
                "--upstream-url",
                f"{mock.url}/v1",
                "--upstream-model",
                MODEL,
                "--model-name",
                MODEL,
                "--upstream-max-concurrency",
                str(4 * max(args.concurrency)),
                "--pii",
                "off",
            ]
            async with LanewayUp(tmp / "lw", KEY, extra) as up:
                doc["systems"]["laneway"] = [await _level(up.url, KEY, c, n, args.tokens, up.cpu) for c, n in levels]
    direct = doc["systems"]["direct"]
    for name in SYSTEMS:
        for lv, base in zip(doc["systems"][name], direct, strict=True):
            lv["added_ttft_p50"] = lv["ttft"]["p50"] - base["ttft"]["p50"]
            lv["added_ttft_p99"] = lv["ttft"]["p99"] - base["ttft"]["p99"]
    doc["best_error_free_rps"] = {
        name: max((lv["requests_per_s"] for lv in levels if lv["errors"] == 0), default=0.0)
        for name, levels in doc["systems"].items()
    }
    return doc


def _version(dist: str) -> str:
    from importlib.metadata import version

    return version(dist)


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}×" if b else "—"


def render(doc: dict) -> str:
    s = doc["systems"]
    lines = [
        f"Peer: the same mock upstream ({doc['prompt_bytes']} B prompt, {doc['tokens']} tokens streamed, "
        f"no delay) direct, through a pass-through floor, LiteLLM and Laneway; closed loop at c clients",
        f"LiteLLM: {doc['litellm']}",
        f"{'system':<36} {'c':>4} {'n':>5} {'err':>4} | {'TTFT p50':>10} {'TTFT p99':>10} | "
        f"{'added p50':>10} {'added p99':>10} | {'req/s':>7} {'CPU/req':>10}",
    ]
    for name in ("direct", *SYSTEMS):
        for lv in s[name]:
            added = (
                f"{ms(lv['added_ttft_p50']):>10} {ms(lv['added_ttft_p99']):>10}"
                if name != "direct"
                else f"{'':>10} {'':>10}"
            )
            lines.append(
                f"{LABELS[name]:<36} {lv['concurrency']:>4} {lv['requests']:>5} {lv['errors']:>4} | "
                f"{ms(lv['ttft']['p50']):>10} {ms(lv['ttft']['p99']):>10} | {added} | "
                f"{lv['requests_per_s']:>7.1f} {lv['cpu_ms_per_request']:>7.2f} ms"
            )
    best = doc["best_error_free_rps"]
    lines.append("Highest error-free req/s: " + ", ".join(f"{LABELS[n]} {best[n]:.1f}" for n in ("direct", *SYSTEMS)))
    lines.append("Laneway / LiteLLM, per c:")
    for lw, ll in zip(s["laneway"], s["litellm"], strict=True):
        lines.append(
            f"  c={lw['concurrency']}: req/s {_ratio(lw['requests_per_s'], ll['requests_per_s'])}, "
            f"CPU/req {_ratio(lw['cpu_ms_per_request'], ll['cpu_ms_per_request'])}, "
            f"added TTFT p50 {ms(lw['added_ttft_p50'])} vs {ms(ll['added_ttft_p50'])}, "
            f"p99 {ms(lw['added_ttft_p99'])} vs {ms(ll['added_ttft_p99'])}"
        )
    lines.append(f"  highest error-free req/s: {_ratio(best['laneway'], best['litellm'])}")
    lines.append(
        "CPU/req: every process of that system (Laneway: nats-server, broker, worker, bridge); the "
        "mock's own CPU is on the direct row. Laneway runs with --pii off."
    )
    lines.append(
        "Added TTFT is against the mock driven directly at the same c; where the client and the mock "
        "saturate the machine the direct baseline queues too, and a proxy that paces requests can "
        "read below it (negative)."
    )
    return "\n".join(lines)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 32, 256])
    parser.add_argument("--requests", type=int, default=200, help="per level (at least 2×c)")
    parser.add_argument("--tokens", type=int, default=64, help="tokens the mock streams per answer")
    parser.add_argument(
        "--proxy-path",
        type=Path,
        default=DEFAULT_PROXY_PATH,
        help="a directory with the LiteLLM proxy's modules, put on its PYTHONPATH if it exists (default: %(default)s)",
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")


def run(args: argparse.Namespace) -> int:
    from loadtest.benchcli import run_and_report

    return run_and_report(args, run_benchmark, render)


if __name__ == "__main__":
    main(__doc__, configure, run)
