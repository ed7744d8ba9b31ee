"""One bridge's run of one batch, from where its record says it stands: validate the input file,
run the lines not finished yet, finalize the output and error files. It renews the batch's lease
while it runs and stops the moment the lease is lost (another bridge runs the batch then), the
batch is cancelled (its lines in flight are cancelled, those finished are kept) or its
completion window ends (the same, and the rest expire)."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from typing import TYPE_CHECKING, Protocol

import msgspec

from bridge.batch import lines as jsonl
from bridge.batch.lease import Lease, LeaseLost
from bridge.errors import EdgeError
from core.tasks import pause
from schemas.batches import BatchError, BatchErrors, BatchState, BatchUsage, LineResult, RequestCounts
from schemas.errors import PASSING, ErrorCode
from schemas.usage import Superseded

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Mapping

    from bridge.batch.store import BatchStore
    from bridge.files.store import FileStore
    from bridge.generate.routes import Generations
    from core.catalogue import Catalogue

log = logging.getLogger("laneway.batch")

MAX_BACKOFF_S = 10.0  # a line refused for a passing reason (PASSING) is tried again, with backoff
# A line's deadline is its batch's window: "deadline exceeded" before this bridge's clock reads the
# window's end came from a class's queue-wait bound or another process's timer, not from the window.
NOT_YET = PASSING | {ErrorCode.deadline_exceeded}


def line_request_id(batch_id: str, line: int, owner: str, attempt: int) -> str:
    return f"{batch_id}-{line}-{owner}-{attempt}"


def output_file_ids(batch_id: str) -> tuple[str, str]:
    """Fixed per batch: a finalization run twice (its owner died between the files and the
    record) writes the same two files again, never a second pair."""
    suffix = batch_id.removeprefix("batch_")
    return f"file-{suffix}o", f"file-{suffix}e"


class Runner(Protocol):
    """What a run uses of the runner that started it (`runner.BatchRunner`), named here so that
    this file need not import that one (which imports this)."""

    store: BatchStore
    files: FileStore
    endpoints: Mapping[str, Generations]
    catalogue: Catalogue
    edge_id: str
    klass: str
    lease: Lease
    slots: asyncio.Semaphore  # lines in flight from this bridge
    cancel: Callable[[str, str], Awaitable[None]]  # (tenant, request id)


class BatchRun:
    def __init__(self, runner: Runner, state: BatchState, before: BatchState | None) -> None:
        self.runner = runner
        self.state = state
        self.tenant = state.tenant
        self.id = state.batch.id
        # Lines the previous owner may have in flight: cancelled before they run here again.
        self.before = before if before is not None and before.owner not in ("", runner.edge_id) else None
        self.done: dict[int, LineResult] = {}
        self.rerun: set[int] = set()  # lines the previous owner had in flight, run again here
        self.submitted = state.submitted
        self.ending: str | None = None  # "cancelled" | "expired": stop submitting
        self._lines: dict[int, asyncio.Task[None]] = {}
        self._lost = False
        self._found: tuple[list[jsonl.InputLine], list[BatchError]] | None = None  # see _input

    async def go(self) -> None:
        main = asyncio.current_task()
        assert main is not None  # a coroutine runs in a task
        keeper = asyncio.create_task(self._keep_lease(main), name=f"lease-{self.id}")
        try:
            status: str = self.state.batch.status
            if status == "validating":
                status = await self._validate()
            if status == "in_progress":
                await self._execute()
                status = self.ending or "completed"
            elif status == "cancelling":
                status = "cancelled"
            if status in ("completed", "cancelled", "expired", "finalizing"):
                await self._finalize("completed" if status == "finalizing" else status)
        except asyncio.CancelledError:
            if self._lost:
                raise LeaseLost(self.id) from None
            raise
        finally:
            keeper.cancel()
            for task in list(self._lines.values()):
                task.cancel()
            await asyncio.gather(keeper, *self._lines.values(), return_exceptions=True)

    # -- the lease, and what the record says meanwhile ---------------------------------------
    async def _keep_lease(self, main: asyncio.Task) -> None:
        while True:
            await pause(self.runner.lease.seconds / 3)
            try:
                self.state = await self.runner.lease.take(self.tenant, self.id, submitted=self.submitted)
            except LeaseLost:
                self._lost = True
                main.cancel()
                return
            except Exception:
                log.warning("batch %s: lease not renewed this time", self.id, exc_info=True)
                continue
            if self.state.batch.status == "cancelling":
                self._end("cancelled")
            elif time.time() >= self.state.batch.expires_at:
                self._end("expired")
            elif self.state.batch.status == "in_progress":
                failed = sum(r.failed for r in self.done.values())
                counts = RequestCounts(total=self.state.lines, completed=len(self.done) - failed, failed=failed)
                if counts != self.state.batch.request_counts:  # progress, as OpenAI shows it
                    await self._set(request_counts=counts)

    def _end(self, why: str) -> None:
        if self.ending is None:
            self.ending = why
            for task in list(self._lines.values()):
                task.cancel()

    async def _set(self, **batch) -> BatchState:
        """Change the public batch object (under our lease)."""

        def change(state: BatchState) -> BatchState:
            if state.owner != self.runner.edge_id:
                raise LeaseLost(self.id)
            return msgspec.structs.replace(state, batch=msgspec.structs.replace(state.batch, **batch))

        self.state = await self.runner.store.update(self.tenant, self.id, change) or self.state
        return self.state

    # -- validating ---------------------------------------------------------------------------
    async def _input(self) -> tuple[list[jsonl.InputLine], list[BatchError]]:
        """The input file's lines, or (no lines) its problems, read once per run: validating,
        running and finalizing all need them."""
        if self._found is None:
            self._found = await self._read_input()
        return self._found

    async def _read_input(self) -> tuple[list[jsonl.InputLine], list[BatchError]]:
        b = self.state.batch
        content = await self.runner.files.content(self.tenant, b.input_file_id)
        if content is None:
            return [], [
                BatchError("file_not_found", f"the input file {b.input_file_id!r} no longer exists", "input_file_id")
            ]
        # In a thread: a large file's lines take the parser long enough to stall every stream here.
        lines, errors = await asyncio.to_thread(jsonl.parse, content, b.endpoint)
        return ([], errors) if errors else (lines, [])

    async def _validate(self) -> str:
        lines, errors = await self._input()
        now = int(time.time())
        if errors:
            await self._set(status="failed", failed_at=now, errors=BatchErrors(list(errors)))
            await self._finish_record()
            return "failed"
        model = msgspec.json.decode(bytes(lines[0].body)).get("model") if lines else None
        self.state = await self.runner.lease.take(self.tenant, self.id, lines=len(lines))
        await self._set(
            status="in_progress",
            in_progress_at=now,
            request_counts=RequestCounts(total=len(lines)),
            model=model if isinstance(model, str) else None,
        )
        return "in_progress"

    # -- in progress ----------------------------------------------------------------------------
    async def _execute(self) -> None:
        lines, errors = await self._input()
        if errors:  # the input file was deleted mid-batch
            await self._set(errors=BatchErrors(list(errors)))
            self.ending = "expired" if time.time() >= self.state.batch.expires_at else "cancelled"
            return
        self.done = await self.runner.store.done_lines(self.tenant, self.id)
        if self.before is not None:
            for earlier in range(self.before.submitted):
                if earlier not in self.done:
                    await self.runner.cancel(self.tenant, line_request_id(self.id, earlier, self.before.owner, 0))
                    self.rerun.add(earlier)
        if time.time() >= self.state.batch.expires_at:
            self.ending = "expired"
        slots = self.runner.slots
        for index, line in enumerate(lines):
            if time.time() >= self.state.batch.expires_at:
                self._end("expired")
            if self.ending is not None:
                break
            if index in self.done:
                continue
            await slots.acquire()
            if self.ending is not None:
                slots.release()
                break
            task = asyncio.create_task(self._line(index, line))
            self._lines[index] = task
            task.add_done_callback(functools.partial(self._line_done, index))
            self.submitted = max(self.submitted, index + 1)
        await asyncio.gather(*self._lines.values(), return_exceptions=True)
        if self.ending is None and time.time() >= self.state.batch.expires_at:
            self.ending = "expired"  # its last lines ran out of window: they expired, none was cancelled

    def _line_done(self, index: int, _task: asyncio.Task[None]) -> None:
        self._lines.pop(index, None)
        self.runner.slots.release()

    async def _line(self, index: int, line: jsonl.InputLine) -> None:
        generations = self.runner.endpoints[self.state.batch.endpoint]
        deadline = float(self.state.batch.expires_at)
        backoff = 0.5
        for attempt in range(1_000):
            request_id = line_request_id(self.id, index, self.runner.edge_id, attempt)
            tenant = self.runner.catalogue.tenants.get(self.tenant)
            try:
                if tenant is None:
                    raise EdgeError(ErrorCode.unknown_tenant, "the batch's tenant no longer exists")
                body = await generations.complete(tenant, bytes(line.body), request_id, self.runner.klass, deadline)
                result = LineResult(
                    index, jsonl.answered(line.custom_id, 200, request_id, body), False, *jsonl.usage_of(body)
                )
                break
            except EdgeError as err:
                left_s = deadline - time.time()
                if left_s <= 0:
                    return  # the window ended under it: the line expires, it did not fail
                if err.code in NOT_YET:
                    # Tried again until the window ends, then it expires: a refusal that says
                    # "not now" (or a timer that ran out a moment before this clock) is no answer.
                    await pause(min(backoff, left_s))
                    backoff = min(backoff * 2, MAX_BACKOFF_S)
                    continue
                result = LineResult(index, jsonl.answered(line.custom_id, err.status, request_id, err.body()), True)
                break
        self.done[index] = result
        await self.runner.store.record_line(self.tenant, self.id, result)
        if index in self.rerun:  # the earlier run may have been generated and metered: billed once
            await self.runner.store.supersede(Superseded(self.tenant, self.id, index, request_id, time.time()))

    # -- finalizing ---------------------------------------------------------------------------
    async def _finalize(self, outcome: str) -> None:
        now = int(time.time())
        if outcome == "completed":
            await self._set(status="finalizing", finalizing_at=now)
        lines, _ = await self._input()  # no lines when the input file has problems
        done = await self.runner.store.done_lines(self.tenant, self.id)
        code, message = jsonl.EXPIRED if outcome == "expired" else jsonl.CANCELLED
        out: list[bytes] = []
        errors: list[bytes] = []
        usage = BatchUsage()
        for index, line in enumerate(lines):
            result = done.get(index)
            if result is None:
                errors.append(jsonl.not_executed(line.custom_id, code, message))
                continue
            (errors if result.failed else out).append(result.output)
            usage.input_tokens += result.input_tokens
            usage.output_tokens += result.output_tokens
            usage.input_tokens_details["cached_tokens"] += result.cached_tokens
        usage.total_tokens = usage.input_tokens + usage.output_tokens
        out_id, err_id = output_file_ids(self.id)
        files = self.runner.files
        fields: dict = {}
        if out:
            fields["output_file_id"] = (
                await files.put(
                    self.tenant, b"\n".join(out) + b"\n", f"{self.id}_output.jsonl", "batch_output", file_id=out_id
                )
            ).id
        if errors:
            fields["error_file_id"] = (
                await files.put(
                    self.tenant, b"\n".join(errors) + b"\n", f"{self.id}_error.jsonl", "batch_output", file_id=err_id
                )
            ).id
        at = int(time.time())
        await self._set(
            status=outcome,
            **{f"{outcome}_at": at},
            usage=usage,
            request_counts=RequestCounts(total=len(lines), completed=len(out), failed=len(errors)),
            **fields,
        )
        await self._finish_record()
        await self.runner.store.forget_lines(self.tenant, self.id)

    async def _finish_record(self) -> None:
        """No owner any more: the batch is done."""

        def release(state: BatchState) -> BatchState:
            return msgspec.structs.replace(state, owner="", lease_until=0.0)

        self.state = await self.runner.store.update(self.tenant, self.id, release) or self.state
