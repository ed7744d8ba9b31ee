"""Entries → the Responses API's shape: one `response` object, or its typed SSE events
(`event:` + `data:` lines, each with a `sequence_number`, no [DONE]).

Output items follow one another: a reasoning item, a `message` (output_text and refusal
parts) or a `function_call` opens when its first piece arrives and closes when the next item
opens or the generation finishes. The same state machine serves both: a non-streamed answer
builds the items and writes no events. Only choice 0 exists here (Responses has no `n`).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import msgspec
import orjson

from bridge.errors import EdgeError
from bridge.render.chat import finish_reason
from bridge.render.output_items import OutputItem, Part, logprob_json
from bridge.render.stored import stored_view
from schemas.frames import Delta, Finished, TokenLogprob
from schemas.requests import GenerateRequest
from schemas.responses import ResponsesBody

_INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}
_ERROR_CODES = {"rate_limited": "rate_limit_exceeded", "queue_full": "rate_limit_exceeded"}


class ResponsesRenderer:
    """Streams: `start()` → `delta()`s → `finish()` or `failed()`; otherwise `add()`s → `body()`."""

    def __init__(self, generate: GenerateRequest, body: ResponsesBody, *, store: bool = False) -> None:
        self.generate = generate
        self.request = body
        self.store = store  # what the tenant's policy made of the client's `store`
        self.final: dict[str, Any] | None = None  # the last Response object: what is stored
        # Awaited once the response has ended, before its last event is written (the store's
        # write: a client that reads the end and then asks for the response finds it).
        self.before_end: Callable[[], Awaitable[None]] | None = None
        self.input_messages = b""  # the input as the engine got it (Finished.messages) ...
        self.input_fields = b""  # ... and its other texts (Finished.fields)
        self.id = f"resp_{generate.request_id}"
        self.created = int(generate.created_at)
        self.model = generate.model
        self.streaming = body.stream
        self.logprobs = body.logprobs
        self._seq = 0
        self._out: list[bytes] = []
        self._items: list[OutputItem] = []
        self._open: OutputItem | None = None
        self._calls: dict[int, OutputItem] = {}  # tool-call index → its item
        self._reasoning_tokens = 0
        self._text_head = b""  # the plain text delta's event, up to its text

    # -- events ---------------------------------------------------------------------------------
    def _event(self, kind: str, **fields: Any) -> None:
        if not self.streaming:
            return
        name = kind.encode()
        self._out.append(
            b"event: "
            + name
            + b"\ndata: "
            + orjson.dumps({"type": kind, "sequence_number": self._seq, **fields})
            + b"\n\n"
        )
        self._seq += 1

    def _flush(self) -> bytes:
        out = b"".join(self._out)
        self._out.clear()
        return out

    # -- items ----------------------------------------------------------------------------------
    def _open_item(self, kind: str) -> OutputItem:
        self._close_item()
        prefix = {"message": "msg", "function_call": "fc", "reasoning": "rs"}[kind]
        item = OutputItem(kind, f"{prefix}_{self.generate.request_id}_{len(self._items)}", len(self._items))
        self._items.append(item)
        self._open = item
        self._event("response.output_item.added", output_index=item.index, item=item.json("in_progress"))
        return item

    def _part(self, item: OutputItem, kind: str) -> tuple[Part, int]:
        """The item's open part of this kind (a new one when the last part is another kind)."""
        if item.parts and item.parts[-1].kind == kind:
            return item.parts[-1], len(item.parts) - 1
        self._close_part(item)
        part = Part(kind)
        item.parts.append(part)
        index = len(item.parts) - 1
        self._event(
            "response.content_part.added",
            item_id=item.id,
            output_index=item.index,
            content_index=index,
            part=part.json(),
        )
        if kind == "output_text" and self.streaming:
            self._text_head = (
                b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta",'
                b'"item_id":'
                + orjson.dumps(item.id)
                + b',"output_index":'
                + str(item.index).encode()
                + b',"content_index":'
                + str(index).encode()
                + b',"logprobs":[],"delta":'
            )
        return part, index

    def _close_part(self, item: OutputItem) -> None:
        if not item.parts:
            return
        part, index = item.parts[-1], len(item.parts) - 1
        where = {"item_id": item.id, "output_index": item.index, "content_index": index}
        text = "".join(part.pieces)
        if part.kind == "output_text":
            self._event("response.output_text.done", **where, text=text, logprobs=part.logprobs)
        elif part.kind == "refusal":
            self._event("response.refusal.done", **where, refusal=text)
        else:
            self._event("response.reasoning_text.done", **where, text=text)
        if part.kind != "reasoning_text":
            self._event("response.content_part.done", **where, part=part.json())

    def _close_item(self, status: str = "completed") -> None:
        item, self._open = self._open, None
        if item is None:
            return
        item.done = True
        if item.kind == "function_call":
            self._event(
                "response.function_call_arguments.done",
                item_id=item.id,
                output_index=item.index,
                name=item.name,
                arguments="".join(item.arguments),
            )
        else:
            self._close_part(item)
        self._event("response.output_item.done", output_index=item.index, item=item.json(status))

    def _text(self, kind: str, text: str, logprobs: Sequence[TokenLogprob] = ()) -> None:
        item_kind = "reasoning" if kind == "reasoning_text" else "message"
        item = self._open if self._open is not None and self._open.kind == item_kind else self._open_item(item_kind)
        part, index = self._part(item, kind)
        part.pieces.append(text)
        where = {"item_id": item.id, "output_index": item.index, "content_index": index}
        if kind == "output_text":
            lps = [logprob_json(lp) for lp in logprobs] if self.logprobs else []
            part.logprobs.extend(lps)
            if lps or not self.streaming:
                self._event("response.output_text.delta", **where, delta=text, logprobs=lps)
            else:
                self._out.append(
                    self._text_head + orjson.dumps(text) + b',"sequence_number":' + str(self._seq).encode() + b"}\n\n"
                )
                self._seq += 1
        elif kind == "refusal":
            self._event("response.refusal.delta", **where, delta=text)
        else:
            self._event("response.reasoning_text.delta", **where, delta=text)

    def add(self, delta: Delta) -> None:
        if delta.choice:
            return
        if delta.reasoning:
            self._reasoning_tokens += len(delta.token_ids) or 1
            self._text("reasoning_text", delta.reasoning)
        if delta.text:
            self._text("output_text", delta.text, delta.logprobs)
        if delta.refusal:
            self._text("refusal", delta.refusal)
        for piece in delta.tool_calls:
            item = self._calls.get(piece.index)
            if item is None:
                item = self._calls[piece.index] = self._open_item_for_call(piece.index, piece.id, piece.name)
            if piece.arguments:
                item.arguments.append(piece.arguments)
                if not item.done:
                    self._event(
                        "response.function_call_arguments.delta",
                        item_id=item.id,
                        output_index=item.index,
                        delta=piece.arguments,
                    )

    def _open_item_for_call(self, index: int, call_id: str, name: str) -> OutputItem:
        self._close_item()
        item = OutputItem("function_call", f"fc_{self.generate.request_id}_{len(self._items)}", len(self._items))
        item.call_id = call_id or f"call_{self.generate.request_id}_{index}"
        item.name = name
        self._items.append(item)
        self._open = item
        self._event("response.output_item.added", output_index=item.index, item=item.json("in_progress"))
        return item

    # -- the response object ----------------------------------------------------------------------
    def _response(
        self, status: str, finished: Finished | None = None, error: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        body = self.request
        incomplete = None
        if finished is not None and status == "incomplete":
            incomplete = {"reason": _INCOMPLETE.get(finished.finish_reason, "max_output_tokens")}
        item_status = "incomplete" if status == "incomplete" else "completed"
        fmt = body.text.format if body.text is not None and body.text.format is not None else None
        text: dict[str, Any] = {"format": msgspec.to_builtins(fmt) if fmt is not None else {"type": "text"}}
        if body.text is not None and body.text.verbosity is not None:
            text["verbosity"] = body.text.verbosity
        response = {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "background": bool(body.background),
            "error": error,
            "incomplete_details": incomplete,
            "instructions": body.instructions,
            "max_output_tokens": body.max_output_tokens,
            "max_tool_calls": None,
            "model": self.model,
            "output": [i.json(item_status) for i in self._items] if status not in ("in_progress", "queued") else [],
            "parallel_tool_calls": body.parallel_tool_calls if body.parallel_tool_calls is not None else True,
            "previous_response_id": body.previous_response_id,
            "reasoning": msgspec.to_builtins(body.reasoning)
            if body.reasoning is not None
            else {"effort": None, "summary": None},
            "safety_identifier": body.safety_identifier,
            "prompt_cache_key": body.prompt_cache_key,
            "service_tier": body.service_tier or "default",
            "store": self.store,
            "temperature": body.temperature,
            "text": text,
            "tool_choice": msgspec.to_builtins(body.tool_choice) if body.tool_choice is not None else "auto",
            "tools": [msgspec.to_builtins(t) for t in body.tools or ()],
            "top_logprobs": body.top_logprobs,
            "top_p": body.top_p,
            "truncation": body.truncation or "disabled",
            "usage": self._usage(finished) if finished is not None else None,
            "user": body.user,
            "metadata": body.metadata or {},
            "completed_at": int(time.time()) if status == "completed" else None,
        }
        if body.user is None:
            del response["user"]  # a string when present (OpenAI's schema), never null
        if finished is None:
            del response["usage"]  # an object when there is one (queued, in progress, failed): never null
        if body.conversation is not None:
            conversation = body.conversation
            response["conversation"] = {"id": conversation if isinstance(conversation, str) else conversation["id"]}
        # A background response is only ever read from the store, its events too: as stored.
        return self.stored(response) if body.background else response

    def stored(self, response: dict[str, Any]) -> dict[str, Any]:
        """`response` as it is stored: what it repeats of the request as the PII stage left it."""
        return stored_view(response, self.request, self.input_messages, self.input_fields)

    def _echoed(self, finished: Finished) -> Finished:
        """The input as the engine got it, taken before the final Response is made of it."""
        self.input_messages, self.input_fields = finished.messages, finished.fields
        return finished

    def _ended(self, response: dict[str, Any]) -> dict[str, Any]:
        self.final = response
        return response

    def snapshot(self, status: str) -> dict[str, Any]:
        """The Response object before the end (`queued`, `in_progress`)."""
        return self._response(status)

    def _usage(self, finished: Finished) -> dict[str, Any]:
        u = finished.usage
        return {
            "input_tokens": u.prompt_tokens,
            "input_tokens_details": {"cached_tokens": u.cached_tokens, "cache_write_tokens": 0},
            "output_tokens": u.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": min(self._reasoning_tokens, u.completion_tokens)},
            "total_tokens": u.prompt_tokens + u.completion_tokens,
        }

    def _final_status(self, finished: Finished) -> str:
        return "incomplete" if finish_reason(finished.finish_reason) in _INCOMPLETE else "completed"

    # -- the renderer protocol respond.py drives --------------------------------------------------
    def start(self) -> bytes:
        created = self._response("in_progress")
        self._event("response.created", response=created)
        self._event("response.in_progress", response=created)
        return self._flush()

    def delta(self, delta: Delta) -> bytes:
        if (
            delta.plain
            and self._open is not None
            and self._open.kind == "message"
            and self._open.parts
            and self._open.parts[-1].kind == "output_text"
        ):
            self._open.parts[-1].pieces.append(delta.text)  # the hot path: one template
            out = (
                self._text_head + orjson.dumps(delta.text) + b',"sequence_number":' + str(self._seq).encode() + b"}\n\n"
            )
            self._seq += 1
            return out
        self.add(delta)
        return self._flush()

    def finish(self, finished: Finished) -> bytes:
        status = self._final_status(finished)
        self._close_item("incomplete" if status == "incomplete" else "completed")
        response = self._ended(self._response(status, self._echoed(finished)))
        self._event("response.completed" if status == "completed" else "response.incomplete", response=response)
        return self._flush()

    def usage_chunk(self, finished: Finished) -> bytes:
        return b""  # usage rides on response.completed

    def failed(self, err: EdgeError) -> bytes:
        """An error after the stream started: `response.failed`, carrying what was generated."""
        error = {"code": _ERROR_CODES.get(err.code.value if err.code else "", "server_error"), "message": err.message}
        self._event("response.failed", response=self._ended(self._response("failed", error=error)))
        return self._flush()

    def body(self, finished: Finished) -> bytes:
        self.streaming = False
        self._close_item()
        status = self._final_status(finished)
        response = self._ended(self._response(status, self._echoed(finished)))
        return orjson.dumps(response)
