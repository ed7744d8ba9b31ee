"""Which media URLs in a chat request an engine may fetch. Pure: no I/O, no vllm.

An engine that fetches a tenant's `image_url` fetches it from inside the operator's network: the
NATS monitoring port, cloud metadata (169.254.169.254), internal services. So the rule is an
allow-list, empty by default (a worker then fetches no remote media at all):

- `data:` URLs carry their bytes inline: always allowed.
- `http:` / `https:`: only to a host named in the allow-list, matched exactly and without regard
  to case, as vLLM's own `allowed_media_domains` matches: `example.com` does not admit
  `cdn.example.com` (list each host). Only on the scheme's own port (80, 443). Never with a user
  name or password (`http://example.com@127.0.0.1/` is 127.0.0.1's), nor with what parsers read
  two ways (backslashes, whitespace, control characters). The list holds host names, never IP
  addresses, so an IP literal (127.0.0.1, [::1], 169.254.169.254, 2130706433) is never fetched.
- `file:`: only where the operator set vLLM's `allowed_local_media_path` (vLLM then keeps it
  under that directory).
- Any other scheme is refused.

A content part names media by URL under `image_url`, `audio_url` or `video_url`, a string or
`{"url": ...}`, whatever its `type`: the OpenAI shape (`{"type": "image_url", "image_url": {"url":
...}}`), the Responses one (`{"type": "input_image", "image_url": "..."}`) and vLLM's untyped one
(`{"image_url": ...}`). Any other key ending in `_url` is read the same way, so that a field a
later vLLM fetches is not passed unread. `input_audio` and the `*_embeds` parts carry their bytes.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

FLAG = "--allowed-media-domains"
_PORTS = {"http": 80, "https": 443}
_AMBIGUOUS = re.compile(r"[\x00-\x20\x7f\\]")  # whitespace, control characters, backslash
_LABEL = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
# A host name: dot-separated labels, the last starting with a letter, as top-level domains do
# (which leaves out 10.0.0.1, 2130706433 and 0x7f000001: numbers a resolver reads as addresses).
_HOST_NAME = re.compile(rf"^(?:{_LABEL}\.)*(?=[a-z])(?:{_LABEL})$")


@dataclass(frozen=True, slots=True)
class MediaFetchPolicy:
    """What one engine may fetch for a request: the default fetches nothing but `data:` URLs."""

    domains: frozenset[str] = frozenset()  # host names, lower case (`parse_media_domains`)
    local_files: bool = False  # vLLM's allowed_local_media_path is set


@dataclass(frozen=True, slots=True)
class RefusedMediaUrl:
    """A media URL the engine may not fetch: where it sits, under which key, and why."""

    param: str  # e.g. messages[0].content[1].image_url
    field: str  # the part's key: image_url, audio_url, video_url, ...
    message: str  # names the field and the host (or scheme)


def parse_media_domains(text: str) -> frozenset[str]:
    """`--allowed-media-domains example.com,cdn.example.org` → host names; an IP address, a
    wildcard, a port or a URL is refused (argparse reports it as the flag's error)."""
    domains = frozenset(d.strip().lower() for d in text.split(",") if d.strip())
    for domain in sorted(domains):
        if not _HOST_NAME.match(domain):
            raise argparse.ArgumentTypeError(
                f"{domain!r} is not a host name (each host is listed by its name, exactly: no IP "
                f"address, wildcard, port or URL)"
            )
    return domains


def media_url_refusal(field: str, url: str, policy: MediaFetchPolicy) -> str | None:
    """Why `url` (a content part's `field`) may not be fetched under `policy`; None if it may."""
    if url[:5].lower() == "data:":  # vLLM's own test: the bytes are in the URL
        return None
    if _AMBIGUOUS.search(url):
        return f"{field} is not a well-formed URL (whitespace, control characters or backslashes)"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return f"{field} is not a well-formed URL"
    if parts.scheme == "file":
        return None if policy.local_files else (f"{field} names a local file (file:), which this worker does not read")
    if parts.scheme not in _PORTS:
        scheme = f"scheme {parts.scheme!r}" if parts.scheme else "URL without a scheme"
        return f"{field} {scheme} is not fetched: use http(s) or a data: URL"
    if "@" in parts.netloc:
        return f"{field} has a user name or password before its host (user@host), which this worker does not fetch"
    host = parts.hostname
    if not host:
        return f"{field} names no host"
    if host not in policy.domains:
        return f"{field} host {host} is not in this worker's {FLAG}"
    if port is not None and port != _PORTS[parts.scheme]:
        return f"{field} port {port} is not fetched: only {parts.scheme}'s own port {_PORTS[parts.scheme]}"
    return None


def first_refused_media_url(messages: Sequence[Mapping[str, Any]], policy: MediaFetchPolicy) -> RefusedMediaUrl | None:
    """The first media URL in chat `messages` (as JSON builtins, what vLLM validates) that
    `policy` does not let the engine fetch, or None."""
    for i, message in enumerate(messages):
        content = message.get("content")
        if not isinstance(content, list):
            continue
        for j, part in enumerate(content):
            if not isinstance(part, dict):
                continue
            for key, value in part.items():
                if not key.endswith("_url"):
                    continue
                url = value.get("url") if isinstance(value, dict) else value
                if not isinstance(url, str):
                    continue
                if (reason := media_url_refusal(key, url, policy)) is not None:
                    return RefusedMediaUrl(f"messages[{i}].content[{j}].{key}", key, reason)
    return None
