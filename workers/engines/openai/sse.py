"""Server-sent events, byte level: the `data:` payload of each event in a `text/event-stream`.

Pure: bytes go in as read (any split, events or lines cut anywhere), payloads come out when a
blank line ends an event that had data. `data:` lines of one event are joined with a newline; one
space after the colon is dropped; `event:`, `id:`, `retry:` and `:` comments (keep-alives) carry
nothing we use. Lines end in LF, CRLF or CR.

`EventSplitter` works on whole reads: line endings are normalised to LF with two `replace`
calls (only when a CR is present), events split on the blank line with one `split`, and the
usual one-line `data: {...}` event needs no line loop at all.
"""

from __future__ import annotations

MAX_EVENT_BYTES = 16 << 20  # an upstream that never ends an event must not eat our memory


class EventTooLarge(ValueError):
    pass


class EventSplitter:
    """Feed it reads; it returns the payloads of the events they complete."""

    __slots__ = ("_rest", "_cr", "_started", "_limit")

    def __init__(self, limit: int = MAX_EVENT_BYTES) -> None:
        self._rest = b""  # the unfinished event, line endings already LF
        self._cr = False  # the last read ended in CR: an LF opening the next is its pair
        self._started = False
        self._limit = limit

    def feed(self, data: bytes) -> list[bytes]:
        if not self._started and data:
            self._started = True
            if data.startswith(b"\xef\xbb\xbf"):  # a UTF-8 BOM may open the stream
                data = data[3:]
        if self._cr and data.startswith(b"\n"):
            data, self._cr = data[1:], False
        if b"\r" in data:
            self._cr = data.endswith(b"\r")
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        elif data:
            self._cr = False
        blocks = (self._rest + data).split(b"\n\n") if self._rest else data.split(b"\n\n")
        self._rest = blocks.pop()
        if len(self._rest) > self._limit:
            raise EventTooLarge(f"an event longer than {self._limit} bytes")
        out = []
        for block in blocks:
            if block.startswith(b"data: ") and b"\n" not in block:  # the usual one-line event, inline
                out.append(block[6:])
            elif (payload := _payload(block)) is not None:
                out.append(payload)
        return out

    def end(self) -> bytes | None:
        """The end of the stream: the payload of an event it cut short, or None."""
        rest, self._rest = self._rest, b""
        return _payload(rest) if rest else None


def _payload(block: bytes) -> bytes | None:
    """The data of one event's lines (LF-separated, no blank line inside), or None."""
    if b"\n" not in block:  # the usual case: one line
        if block.startswith(b"data:"):
            return block[6:] if block[5:6] == b" " else block[5:]
        return b"" if block == b"data" else None
    data = []
    for line in block.split(b"\n"):
        if line.startswith(b"data:"):
            data.append(line[6:] if line[5:6] == b" " else line[5:])
        elif line == b"data":
            data.append(b"")
    return b"\n".join(data) if data else None


class DataEvents:
    """Line-at-a-time front of `EventSplitter`: feed it lines until it returns a payload."""

    __slots__ = ("_events",)

    def __init__(self) -> None:
        self._events = EventSplitter()

    def feed(self, line: bytes) -> bytes | None:
        """One line of the stream (line ending included); the event's payload once a blank
        line ends an event with data, else None."""
        payloads = self._events.feed(line)
        return payloads[0] if payloads else None

    def end(self) -> bytes | None:
        return self._events.end()
