"""The bridge's HTTP server: aiohttp's protocol, with the limits that slow or hostile clients meet.

- Header timeout: aiohttp's keep-alive timer runs from a connection's start, and again from the end
  of each response, until a complete request head has arrived; a connection still without one is
  closed. (aiohttp starts it at connect; a version that did not would leave such sockets open.)
- Connection cap: a connection past it is answered 503 in the OpenAI shape and closed before any
  of it is read. Counted when a connection is made, so a burst of accepts cannot overshoot it.
- Send buffer: each connection's kernel send buffer is fixed at `SEND_BUFFER_BYTES` (Linux would
  grow it to `tcp_wmem`'s 4 MiB for a client that does not read, in the pod's memory). A stalled
  reader then backs up into the bridge's own bounded buffers (`bridge/streams/demux.py`, the SSE write
  timeout) within a few hundred tokens. 256 KiB is ~1,000 streamed tokens, and ~2.5 MB/s at a
  100 ms round trip: far above what any answer needs.
- aiohttp's own refusals (an oversize header, bytes that are not HTTP, a handler's crash) answer in
  the OpenAI shape, not plain text, and a malformed request logs no traceback.

The body timeout is applied where bodies are read (`Bridge._read_body`).
"""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Protocol, runtime_checkable

from aiohttp import web

from bridge.errors import EdgeError, protocol_error
from bridge.metrics import BridgeMetrics
from schemas.errors import ErrorCode

log = logging.getLogger("laneway.bridge")

# After an answer given before the body was read (408, 413, 401), aiohttp reads and drops what the
# client still sends for this long, so the client sees the answer rather than a reset.
LINGER_S = 2.0
LISTEN_BACKLOG = 4096
SEND_BUFFER_BYTES = 256 * 1024


class _Count:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.open = 0


@runtime_checkable
class _Writes(Protocol):
    def write(self, data: bytes) -> None: ...

    def close(self) -> None: ...


class _Protocol(web.RequestHandler):
    def __init__(self, manager: web.Server, count: _Count, metrics: BridgeMetrics, refusal: bytes, **kwargs) -> None:
        super().__init__(manager, **kwargs)
        self._count = count
        self._metrics = metrics
        self._refusal = refusal
        self._counted = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self._count.open >= self._count.limit:
            self._metrics.rejected.labels("too_many_connections").inc()
            assert isinstance(transport, _Writes)  # a TCP connection's (uvloop's is no asyncio.WriteTransport)
            transport.write(self._refusal)
            transport.close()
            return
        self._count.open += 1
        self._counted = True
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
        super().connection_made(transport)

    def connection_lost(self, exc: BaseException | None) -> None:
        if not self._counted:
            return  # refused in connection_made: aiohttp never saw it
        self._counted = False
        self._count.open -= 1
        super().connection_lost(exc)

    def handle_error(
        self, request: web.BaseRequest, status: int = 500, exc: BaseException | None = None, message: str | None = None
    ) -> web.StreamResponse:
        if request.writer.output_size > 0:
            raise ConnectionError("the response had started; the connection is dropped")  # as aiohttp does
        if status >= 500:
            self.log_exception("error handling a request", exc_info=exc)
        error = protocol_error(status, exc)
        self._metrics.rejected.labels(error.code.value if error.code else str(error.status)).inc()
        response = error.response()
        response.force_close()
        return response


class HttpServer:
    """An aiohttp app on a listening socket of our own, so that every connection is a `_Protocol`."""

    def __init__(
        self, app: web.Application, metrics: BridgeMetrics, *, header_timeout_s: float, max_connections: int
    ) -> None:
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        self._metrics = metrics
        self._header_timeout_s = header_timeout_s
        self._count = _Count(max_connections)
        self._listener: asyncio.Server | None = None

    async def start(self, host: str, port: int) -> int:
        """Listen; the port bound (the real one when asked for 0)."""
        await self._runner.setup()
        manager = self._runner.server
        assert manager is not None  # set up
        refusal = EdgeError(
            ErrorCode.overloaded, f"this bridge holds {self._count.limit} connections, its limit; retry shortly"
        ).http()
        kwargs = {
            "loop": asyncio.get_running_loop(),
            "keepalive_timeout": self._header_timeout_s,
            "lingering_time": LINGER_S,
            "access_log": None,
        }
        self._listener = await asyncio.get_running_loop().create_server(
            lambda: _Protocol(manager, self._count, self._metrics, refusal, **kwargs),
            host,
            port,
            backlog=LISTEN_BACKLOG,
        )
        return self._listener.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        await self._runner.cleanup()
