"""Server-sent events, byte level: the `data:` payload of each event in a `text/event-stream`.

Pure: lines go in as read (line ending included), a payload comes out when a blank line ends an
event that had data. `data:` lines of one event are joined with a newline; one space after the
colon is dropped; `event:`, `id:`, `retry:` and `:` comments (keep-alives) carry nothing we use.
"""

from __future__ import annotations


class DataEvents:
    """Assembles one event's data from lines; feed it until it returns the payload."""

    __slots__ = ("_data",)

    def __init__(self) -> None:
        self._data: list[bytes] = []

    def feed(self, line: bytes) -> bytes | None:
        """One line of the stream; the event's payload once a blank line ends an event with
        data, else None (blank lines before any data are skipped)."""
        line = line.rstrip(b"\r\n")
        if not line:
            return self._payload() if self._data else None
        if line.startswith(b"data:"):
            value = line[5:]
            self._data.append(value[1:] if value.startswith(b" ") else value)
        return None

    def end(self) -> bytes | None:
        """The end of the stream: the payload of an event it cut short, or None."""
        return self._payload() if self._data else None

    def _payload(self) -> bytes:
        payload, self._data = b"\n".join(self._data), []
        return payload
