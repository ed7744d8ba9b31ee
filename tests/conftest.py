"""Shared fixtures: a real nats-server per test module (port 0, temporary store)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("TLDEXTRACT_PUBLIC_SUFFIX_LIST_URLS", "")


@pytest.fixture(scope="module")
async def nats_server(tmp_path_factory: pytest.TempPathFactory):
    from core.natsd import SHARED_DISK_FILE_STORE, NatsServer

    # JetStream reserves each stream's max_bytes (4 GiB per request stream, one per prefix, and
    # a module's tests use many prefixes) against a limit that is by default 75% of the disk's
    # free space: a fixed one keeps whether they fit off the machine's disk.
    server = NatsServer(Path(tmp_path_factory.mktemp("nats")), max_file_store=SHARED_DISK_FILE_STORE)
    await server.start()
    yield server
    await server.stop()


# -- the suite in parallel (scripts/test: pytest-xdist) ----------------------------------
# A worker takes a whole module at a time, so a module's fixtures (its nats-server, its stack,
# a `laneway up`) start once, not once on each worker. A real vLLM engine on CPU takes every core
# it is given and GiBs of memory: its modules are one unit, run one after another on one worker.
# Modules are handed out in collection order; the long ones (tests/slow) come first, so the
# short unit tests fill the other workers' time at the end rather than wait on a long tail.
FIRST = ("tests/slow/", "tests/e2e/", "tests/security/", "tests/integration/", "tests/deploy/")


def _scope(nodeid: str) -> str:
    module = nodeid.split("::", 1)[0]
    return "vllm" if "vllm" in module.rsplit("/", 1)[-1] else module


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        return next((i for i, d in enumerate(FIRST) if item.nodeid.startswith(d)), len(FIRST))

    items.sort(key=rank)  # stable: each module's tests keep their order


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False  # xdist's default hands out the most tests first

    class ByModule(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _scope(nodeid)

    return ByModule(config, log)


# -- a hung test says where it hung ---------------------------------------------------------
# pytest-timeout prints thread stacks: for an asyncio test that is the event loop's select(),
# never the await that hangs. Shortly before the timeout, print every task's stack instead.
TASK_DUMP_LEAD_S = 20


def _timeout_of(item: pytest.Item) -> float:
    marker = item.get_closest_marker("timeout")
    if marker is not None and marker.args:
        return float(marker.args[0])
    return float(item.config.getini("timeout") or 0)


def _dump_tasks() -> None:
    import asyncio
    import gc

    for loop in [o for o in gc.get_objects() if isinstance(o, asyncio.AbstractEventLoop)]:
        if loop.is_running():
            loop.call_soon_threadsafe(_print_tasks, loop)


def _print_tasks(loop) -> None:
    import asyncio
    import sys

    tasks = asyncio.all_tasks(loop)
    print(f"\n+++ {len(tasks)} asyncio tasks, {TASK_DUMP_LEAD_S} s before the timeout +++", file=sys.stderr)
    for task in tasks:
        print(f"--- {task.get_name()}: {task.get_coro()!r}", file=sys.stderr)
        task.print_stack(limit=12, file=sys.stderr)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item):
    import threading

    timeout = _timeout_of(item)
    timer = None
    if timeout > TASK_DUMP_LEAD_S * 2:
        timer = threading.Timer(timeout - TASK_DUMP_LEAD_S, _dump_tasks)
        timer.daemon = True
        timer.start()
    try:
        yield
    finally:
        if timer is not None:
            timer.cancel()
