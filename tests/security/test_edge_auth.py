"""The bridge authenticates from the headers before it reads a body.

Before issue 20 every body was read whole (up to 4 MiB, for up to --body-timeout) before any
handler checked the key: a few hundred anonymous clients sending large bodies slowly filled the
bridge's memory limit. Now a caller without a valid key is answered 401 as soon as its headers
are in, with nothing of its body read (a tenant's body is read as before: tests/e2e/test_edge_limits.py).
"""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

import pytest

pytestmark = pytest.mark.timeout(300)

BODY_BYTES = 4_000_000  # announced; only the first bytes are ever sent


async def status_with_most_of_the_body_unsent(url: str, path: str, key: str) -> int:
    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    try:
        writer.write(
            (
                f"POST {path} HTTP/1.1\r\nHost: {parts.netloc}\r\nAuthorization: Bearer {key}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {BODY_BYTES}\r\n\r\n"
                '{"model": "laneway-sim", "messages": ['
            ).encode()
        )
        await writer.drain()
        # Bounded well past nothing, short of the 60 s body timeout that would answer 408.
        line = await asyncio.wait_for(reader.readline(), 30)
        return int(line.split()[1])
    finally:
        writer.close()


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/embeddings", "/v1/admin/routing", "/v1/no-such-route"])
@pytest.mark.parametrize("key", ["sk-not-a-tenant-key", ""])
async def test_an_anonymous_body_is_never_read(up, path, key):
    status = await status_with_most_of_the_body_unsent(up.url, path, key)
    assert status in (401, 404), status
