"""LoRA adapters as logical models on the `vllm` engine: each is loaded into vLLM on its first
request, through the serving layer's own dynamic loading (`OpenAIServingModels.load_lora_adapter`,
what `POST /v1/load_lora_adapter` runs), under the request's model name. From then on vLLM's chat
and completion serving find it by that name (`models.lora_requests`) and generate with it.

- Once per name: concurrent first requests wait on one load (a lock per name); vLLM would refuse
  the second as "already loaded". A name asked for with another path (the models table changed)
  is loaded again in place (`load_inplace`), under the same adapter id.
- A failed load registers nothing: the request ends as an `EngineError` (so the worker lets
  another worker try it) and the next request for the name tries again.
- vLLM keeps the adapters it was given in host memory (up to `max_cpu_loras`, LRU) and the ones
  in use in its `max_loras` batch slots (LRU), reloading an evicted one from its path when a
  request needs it again. Which are resident is the engine core's state, reachable only by an
  async round trip (`list_loras`, and that lists host memory, not the slots), so `resident()`
  approximates the slots as vLLM fills them: the most recently used names, up to `max_loras`.

vllm is imported lazily.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from typing import Any

from workers.engine import EngineError

log = logging.getLogger(__name__)


class Adapters:
    """The LoRA adapters one engine serves, by logical model name."""

    def __init__(self, models: Any, slots: int) -> None:
        self._models = models  # vLLM's OpenAIServingModels
        self._slots = max(1, slots)  # vLLM's max_loras
        self._paths: dict[str, str] = {}  # name → the path it was loaded from
        self._locks: dict[str, asyncio.Lock] = {}
        self._recent: OrderedDict[str, None] = OrderedDict()  # most recently used last

    async def ensure(self, request_id: str, name: str, path: str) -> None:
        """The adapter `name` loaded from `path`, loading it now if it is not; raises
        `EngineError` when vLLM cannot load it."""
        if self._paths.get(name) != path:
            async with self._locks.setdefault(name, asyncio.Lock()):
                if self._paths.get(name) != path:
                    await self._load(request_id, name, path)
        self._recent.pop(name, None)
        self._recent[name] = None
        while len(self._recent) > self._slots:
            self._recent.popitem(last=False)

    async def _load(self, request_id: str, name: str, path: str) -> None:
        from vllm.entrypoints.serve.engine.protocol import ErrorResponse
        from vllm.entrypoints.serve.lora.protocol import LoadLoRAAdapterRequest

        again = name in self._paths
        result = await self._models.load_lora_adapter(
            LoadLoRAAdapterRequest(lora_name=name, lora_path=path, load_inplace=again)
        )
        if isinstance(result, ErrorResponse):
            e = result.error
            # The path is the operator's, not the client's to see: logged here, whole.
            log.warning("LoRA adapter %r failed to load from %s: %s %s", name, path, e.type, e.message)
            raise EngineError(
                request_id,
                f"model {name!r}: its LoRA adapter could not be loaded on "
                f"this worker ({e.type}; the worker's log has the details)",
            )
        self._paths[name] = path
        log.info("LoRA adapter %r loaded from %s", name, path)

    def resident(self) -> tuple[str, ...]:
        """The adapters vLLM holds in its batch slots now, approximately: the most recently
        used names, up to `max_loras`, most recent first."""
        return tuple(reversed(self._recent))
