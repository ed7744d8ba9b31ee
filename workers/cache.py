"""Storing a complete, deterministic answer in the response cache (`core/cache.py`),
in the background (never on the frame path). The broker that set a dispatch's `cache_key`
created the bucket."""

from __future__ import annotations

import asyncio

from nats.js import JetStreamContext

from core.cache import CachedResponse, ResponseCache
from schemas.frames import Delta, Finished
from schemas.subjects import Subjects
from schemas.work import Dispatch


class AnswerStore:
    def __init__(self, js: JetStreamContext, subjects: Subjects) -> None:
        self._js = js
        self._s = subjects
        self._cache: ResponseCache | None = None
        self._stores: set[asyncio.Task[bool]] = set()

    def keep(self, dispatch: Dispatch, parts: list[Delta] | None, cancelled: bool, finished: Finished) -> None:
        """Cache the answer made of `parts` (None: the dispatch asked for no caching)."""
        if parts is None or cancelled or finished.model != dispatch.cache_model:
            return
        answer = CachedResponse(
            parts,
            finished.usage.prompt_tokens,
            finished.usage.completion_tokens,
            finished.finish_reason,
            finished.model,
            finish_reasons=finished.finish_reasons,
            vectors=finished.vectors,
        )
        task = asyncio.create_task(self._store(dispatch.cache_key, answer))
        self._stores.add(task)
        task.add_done_callback(self._stores.discard)

    async def wait(self, timeout_s: float) -> None:
        """Let the stores in flight finish, for at most `timeout_s`."""
        if self._stores:
            await asyncio.wait(self._stores, timeout=timeout_s)

    async def _store(self, key: str, answer: CachedResponse) -> bool:
        if self._cache is None:
            self._cache = ResponseCache(await self._js.key_value(self._s.bucket("cache")))
        return await self._cache.store(key, answer)
