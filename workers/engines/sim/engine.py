"""A SIMULATED GPU engine: continuous batching with a step-time model, honouring the Engine contract.

It exists so the broker can be load-tested at production concurrency on a laptop; every figure
it produces is a simulation and is labelled so. Each engine step is planned as vLLM V1 plans it
(`workers/engines/sim/scheduler.py`: a per-step token budget with chunked prefill, running sequences
first, waiting ones by (priority, arrival), preemption by recompute when KV blocks run out,
prefix-cache hits on shared prompt blocks); the step lasts as long as its GPU roofline says
(`workers/engines/sim/roofline.py`).

It speaks OpenAI as engines do: the body's `n` choices are sequences of their own (each holds a
slot and KV blocks; the later ones find the prompt in the prefix cache), and it simulates stop
strings (exactly, as vLLM's detokenizer), tool calls, JSON outputs and logprobs
(`workers/engines/sim/output.py`), refusing what it cannot honour (`workers/engines/sim/request.py`). A text
answer runs to the client's output limit; without one a choice ends at its simulated EOS (a
natural length per prompt), or at `max_model_len`. JSON and tool calls end where their JSON does.

It also answers embedding requests with SIMULATED vectors (`workers/engines/sim/embed.py`: a hash of each
input, not a model). An embedding is prefill only: it holds one slot and its prompt's KV blocks,
is scheduled as prefill chunks, and finishes when its prompt is computed, decoding nothing.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import zlib
from collections.abc import AsyncIterator

import msgspec

from core.tasks import cancel_and_wait, pause
from schemas.frames import ToolCallDelta
from schemas.openai import Body, ChatBody, EmbeddingBody
from workers.engine import (
    Capacity,
    Continued,
    Engine,
    EngineError,
    EngineOutput,
    EngineRequest,
    RequestKey,
    UnsupportedRequest,
)
from workers.engines.sim.adapters import Adapters
from workers.engines.sim.embed import accept_embedding
from workers.engines.sim.output import Answer, Piece, Unfit, choice_rng, logprob_of, natural_length, plan
from workers.engines.sim.request import SimRequest, accept
from workers.engines.sim.roofline import SimProfile, step_seconds
from workers.engines.sim.running import Req, Seq
from workers.engines.sim.scheduler import BLOCK, Scheduler, SchedulerConfig, Sequence, Step, block_hashes


class SimEngine(Engine):
    name = "sim"
    supports_logprobs = True
    continues = True

    def why_not_continued(self, body: Body, extra: bytes) -> str | None:
        logprobs = not isinstance(body, EmbeddingBody) and body.wants_logprobs  # drawn token by token
        return (
            "the sim cannot draw a continued answer's logprobs" if logprobs else super().why_not_continued(body, extra)
        )

    def __init__(
        self,
        profile: SimProfile,
        *,
        model: str = "",
        speed: float = 1.0,
        max_seqs: int | None = None,
        kv_tokens: int | None = None,
        max_model_len: int = 8192,
        max_num_batched_tokens: int | None = None,
        long_prefill_token_threshold: int | None = None,
        min_step_s: float = 0.0,
        max_loras: int = 4,
        lora_load_s: float = 0.2,
    ) -> None:
        self.profile = profile
        self.model = model or f"sim/{profile.name}"
        self.speed = speed  # >1 runs the same model faster (tests)
        # No step shorter than this: streams at most 1 / min_step_s tokens a second however few
        # run (benchmarks that model streams at a fixed rate, e.g. 30 tok/s, at any occupancy).
        self.min_step_s = min_step_s
        self.max_seqs = max_seqs or profile.max_seqs
        self.kv_tokens = kv_tokens or profile.kv_tokens
        self.max_model_len = max_model_len  # prompt + output, per sequence
        threshold = profile.long_prefill_token_threshold
        self.scheduler = Scheduler(
            SchedulerConfig(
                max_num_seqs=self.max_seqs,
                max_num_batched_tokens=max_num_batched_tokens or profile.max_num_batched_tokens,
                num_blocks=max(1, self.kv_tokens // BLOCK),
                long_prefill_token_threshold=threshold
                if long_prefill_token_threshold is None
                else long_prefill_token_threshold,
                max_loras=max_loras,
            )
        )
        self.adapters = Adapters(max_loras, lora_load_s)  # LoRA adapters: held, and their load time
        self._reqs: dict[RequestKey, Req] = {}
        self._held = 0  # sequences (choices) admitted and not finished
        self._reserved = 0
        self._order = itertools.count()
        self._wake = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        self.steps = 0

    async def start(self) -> None:
        if self._loop_task is None:
            self._loop_task = asyncio.create_task(self._run(), name="sim-engine")

    async def cleanup(self) -> None:
        task, self._loop_task = self._loop_task, None
        await cancel_and_wait(task)
        for req in list(self._reqs.values()):
            self._end(req, "abort")

    def capacity(self) -> Capacity:
        running: dict[str, int] = {}
        for req in self._reqs.values():
            running[req.request.klass] = running.get(req.request.klass, 0) + req.open
        return Capacity(
            total_slots=self.max_seqs,
            free_slots=max(0, self.max_seqs - self._held),
            token_budget=max(0, self.kv_tokens - self._reserved),
            running=running,
            step_tokens=self.scheduler.config.max_num_batched_tokens,
            kv_tokens=self.scheduler.config.num_blocks * BLOCK,
            adapters=self.adapters.held(),
        )

    def num_running(self) -> int:
        """Sequences held: every unfinished choice of every request, waiting or decoding."""
        return self._held

    async def abort(self, key: RequestKey) -> None:
        req = self._reqs.get(key)
        if req is not None:
            self._end(req, "abort")

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        if request.key in self._reqs:
            raise EngineError(request.request_id, "the request is already running on this engine")
        req = self._plan(request)
        need = req.reserve + max((seq.reserve for seq in req.choices), default=0)
        if need > self.scheduler.config.num_blocks * BLOCK:
            raise EngineError(
                request.request_id,
                f"{need} tokens (prompt and output) exceed the "
                f"simulated KV cache of {self.scheduler.config.num_blocks * BLOCK} tokens",
            )
        self._reqs[request.key] = req
        self._held += req.open
        self._reserved += req.reserve + sum(seq.reserve for seq in req.choices)
        # An adapter's KV is its own (vLLM puts the LoRA in the block hashes' extra keys).
        salt = f"{request.cache_salt}\0{request.body.model}" if request.adapter else request.cache_salt
        prompt = req.sim.prompt_tokens + req.replayed
        hashes = block_hashes("".join(request.body.texts()) + req.choices[0].text, prompt, salt)
        for seq in req.choices:
            seq.sched = Sequence(
                seq, request.priority, req.order, prompt, hashes, adapter=request.body.model if request.adapter else ""
            )
            self.scheduler.add(seq.sched)
        self._wake.set()
        try:
            while True:
                if not req.buffer:
                    req.waiter = asyncio.get_running_loop().create_future()
                    await req.waiter
                out = req.buffer.popleft()
                yield out
                if out.finish_reason is not None:
                    return
        finally:
            if not req.done:  # the consumer went away: free the slots
                self._end(req, "abort")

    def _plan(self, request: EngineRequest) -> Req:
        """Check the request and plan every choice's answer, before any of it is generated."""
        body, rid = request.body, request.request_id
        if isinstance(body, EmbeddingBody):
            return self._plan_embedding(request)
        sim = accept(request, self.max_model_len)
        if isinstance(body, ChatBody):
            top = (body.top_logprobs or 0) if body.logprobs else None
        else:
            top = body.logprobs
        # The simulated mean logprob feeds the cascade and logprobs only: not worth a hash otherwise.
        mean = self.confidence(request) if request.confidence or top is not None else 0.0
        req = Req(
            request,
            sim,
            next(self._order),
            mean,
            top,
            open=body.choices,
            reserve=sim.prompt_tokens,
            stops=[s for s in body.stops if s],
        )
        # What a real model's sampling depends on: not stops, limits or logprobs, so a shorter
        # max_tokens or a stop string gives a prefix of the same answer.
        key = msgspec.json.encode(
            [
                body.texts(),
                body.seed,
                getattr(body, "tools", None),
                getattr(body, "tool_choice", None),
                getattr(body, "parallel_tool_calls", None),
                getattr(body, "response_format", None),
            ]
        )
        greedy = body.temperature == 0.0
        prompt = "".join(body.texts())
        for i in range(body.choices):
            rng = choice_rng(key, i, greedy, None if body.deterministic else req.order)
            try:
                answer = plan(body, sim, rng, natural_length(prompt, i, greedy))
            except Unfit as e:
                raise UnsupportedRequest(rid, e.param, str(e)) from None
            if sim.ignore_eos or len(answer.pieces) > sim.cap:
                del answer.pieces[sim.cap :]
                answer.finish = "length"
            reserve = sim.cap if sim.limited else len(answer.pieces)
            req.choices.append(Seq(req, i, answer, reserve, random.Random(rng.getrandbits(64))))
        if request.continued is not None:
            self._continue(req, request.continued)
        return req

    def _continue(self, req: Req, continued: Continued) -> None:
        """A continuation: a lost worker streamed the answer's first tokens. They are prefilled
        with the prompt and generation goes on at the next planned token; the answer is a
        function of the request, so a deterministic one goes on exactly as if unbroken."""
        if len(req.choices) != 1 or req.top is not None:
            raise EngineError(req.request.request_id, "only a single choice without logprobs can be continued")
        seq = req.choices[0]
        pieces, echo = seq.answer.pieces, req.sim.echo
        if continued.token_ids:
            k = len(continued.token_ids)
        else:  # text only: the planned tokens it spans
            k, spans = 0, len(echo)
            while k < len(pieces) and spans + len(pieces[k].text) <= len(continued.text):
                spans += len(pieces[k].text)
                k += 1
        k = min(k, len(pieces))
        seq.produced = req.replayed = k
        seq.text = "".join(p.text for p in pieces[:k] if p.call < 0)
        # What the client got of that text (a stop string's possible start may be held back).
        seq.sent = max(0, min(len(seq.text), len(continued.text) - (len(echo) if k else 0)))
        req.reserve += k

    def _plan_embedding(self, request: EngineRequest) -> Req:
        """An embedding: one sequence whose whole cost is its prefill (no output tokens)."""
        embedding = accept_embedding(request, self.max_model_len)
        sim = SimRequest(embedding.prompt_tokens, cap=0, limited=True)
        req = Req(
            request, sim, next(self._order), 0.0, None, open=1, reserve=sim.prompt_tokens, vectors=embedding.vectors
        )
        req.choices.append(Seq(req, 0, Answer([], "stop"), 0, random.Random(0)))
        return req

    # -- the step loop --------------------------------------------------------------------
    async def _run(self) -> None:
        while True:
            step = self.scheduler.schedule() if self.scheduler.has_work() else Step()
            if step.preempted and not step.scheduled:
                continue  # blocks were freed: the next plan can start others
            if not step.scheduled:  # idle, or nothing fits until a sequence ends
                self._wake.clear()
                await self._wake.wait()
                continue
            loading = self.adapters.activate({s.adapter for s in step.scheduled if s.adapter})
            await pause(self.step_time(step) + loading / self.speed)
            self.steps += 1
            for sched in self.scheduler.finish_step(step):
                seq = sched.owner
                assert isinstance(seq, Seq)
                if seq.req.vectors is not None:
                    self._finish_choice(seq, "stop")  # an embedding: done with its prefill
                else:
                    self._decode_one(seq)

    def step_time(self, step: Step) -> float:
        return max(self.min_step_s, step_seconds(self.profile, step.kv_read, step.tokens) / self.speed)

    def confidence(self, request: EngineRequest) -> float:
        """The SIMULATED model's mean token logprob for a request: a stable number per prompt in
        [-2, 0] (a hash, not a model), so the cascade has a signal to act on."""
        return -(zlib.crc32("".join(request.body.texts()).encode()) % 2000) / 1000

    def _decode_one(self, seq: Seq) -> None:
        req = seq.req
        if seq.produced == len(seq.answer.pieces):  # continued after its last token: only the end
            req.push(EngineOutput(seq.text[seq.sent :], [], index=seq.index))
            seq.sent = len(seq.text)
            self._finish_choice(seq, seq.answer.finish)
            return
        piece = seq.answer.pieces[seq.produced]
        seq.produced += 1
        out = EngineOutput(
            "", [piece.token_id], index=seq.index, confidence=[req.mean] if req.request.confidence else []
        )
        if seq.produced == 1 and req.sim.echo:
            out.text = req.sim.echo
        finish = seq.answer.finish if seq.produced == len(seq.answer.pieces) else None
        if piece.call >= 0:
            out.tool_calls = [ToolCallDelta(piece.call, piece.id, piece.name, piece.text)]
        else:
            if req.top is not None:
                out.logprobs = [logprob_of(req.mean, piece, req.top, seq.rng)]
            text, stopped = self._detokenize(seq, piece)
            out.text += text
            finish = "stop" if stopped else finish
        if finish is not None:
            out.text += seq.text[seq.sent :]  # nothing is held back at the end
            seq.sent = len(seq.text)
        req.push(out)
        if finish is not None:
            self._finish_choice(seq, finish)

    def _detokenize(self, seq: Seq, piece: Piece) -> tuple[str, bool]:
        """The text this token releases, and whether a stop ended the choice. Exact, as vLLM's
        detokenizer: text that could begin a stop string is held back; a stop cuts the text at
        its first position and none of it is ever streamed."""
        sim, stops = seq.req.sim, seq.req.stops
        before = len(seq.text)
        seq.text += piece.text
        if not stops and not sim.stop_token_ids:  # nothing to hold back: every token's text
            seq.sent = len(seq.text)
            return piece.text, False
        checking = seq.produced >= sim.min_tokens  # min_tokens: no stop before it
        if checking and piece.token_id in sim.stop_token_ids:
            seq.text = seq.text[:before]
            return "", True
        if checking:
            hits = [(i, s) for s in stops if (i := seq.text.find(s, max(0, before - len(s) + 1))) >= 0]
            if hits:
                at, stop = min(hits)
                end = max(seq.sent, at + len(stop) if sim.include_stop else at)
                text, seq.text, seq.sent = seq.text[seq.sent : end], seq.text[:end], end
                return text, True
        hold = max((n for s in stops for n in range(len(s) - 1, 0, -1) if seq.text.endswith(s[:n])), default=0)
        end = max(seq.sent, len(seq.text) - hold)
        text, seq.sent = seq.text[seq.sent : end], end
        return text, False

    def _finish_choice(self, seq: Seq, reason: str) -> None:
        self._release(seq, reason)
        if seq.req.open == 0:
            self._end(seq.req, reason)

    def _release(self, seq: Seq, reason: str) -> None:
        """The choice's slot and KV tokens go back."""
        if seq.finish is not None:
            return
        seq.finish = reason
        if seq.sched is not None:
            self.scheduler.finish(seq.sched)
        self._held -= 1
        self._reserved -= seq.reserve
        seq.req.open -= 1

    def _end(self, req: Req, reason: str) -> None:
        """The request is over (all its choices finished, or aborted): one last output."""
        if req.done:
            return
        for seq in req.choices:
            self._release(seq, reason)
        req.done = True
        self._reqs.pop(req.request.key, None)
        self._reserved -= req.reserve
        reasons = [seq.finish or reason for seq in req.choices]
        # The prompt is counted once, so are its cache hits: choice 0's (choices queue in order: it starts first).
        hits = [seq.sched.first_hit for seq in req.choices if seq.sched and seq.sched.first_hit is not None]
        req.push(
            EngineOutput(
                "",
                [],
                finish_reason="abort" if reason == "abort" else reasons[0],
                prompt_tokens=req.sim.prompt_tokens + req.replayed,
                cached_tokens=hits[0] if hits else 0,
                completion_tokens=sum(seq.produced for seq in req.choices) - req.replayed,
                finish_reasons=reasons if len(reasons) > 1 else [],
                vectors=(req.vectors or []) if reason != "abort" else [],
            )
        )
