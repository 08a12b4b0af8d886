"""A live emulated vLLM replica: vLLM's HTTP surface over a timing model.

Serves POST /v1/chat/completions and /v1/completions (streamed and not, ``usage``,
``stream_options.include_usage``), GET /v1/models, /health, /metrics (vLLM's metric
names), POST /tokenize, and the rest of vLLM's routes (``sim.emulator.surface`` and
``sim.emulator.generate``: embeddings, responses, messages, audio, LoRA, ...) — the same
bodies and SSE framing vLLM sends, so the router, the OpenAI SDKs and tests cannot tell
it from a real engine except by speed.

Timing comes from an ``Engine``: for each request it returns when the first token is due
and the time per output token; the server sleeps those durations (model seconds x
``time_scale``) before sending. The engine's clock is model time,
``(clock() - start) / time_scale``, so a model planning a whole timeline at admission
(``sim.emulator.engine.ModelEngine``) sees the same ordering as wall time. Engines:
``ConstantEngine`` (fixed TTFT/TPOT, API tests) and ``ModelEngine`` (the replica model).
Replies are deterministic (``sim.emulator.tokens``): two replicas answer one prompt alike.

Faults (POST /_emulator/faults, JSON, all optional; ``{}`` clears them):
``http_status`` answers every completion with that status; ``health_status`` makes
/health answer it; ``break_after_chunks`` drops the connection after that many SSE
chunks; ``poison`` (a string) makes a completion whose body contains it answer a
plain-text ``500 Internal Server Error``, as an engine's server does on an exception it did
not catch (a "poison" request: every replica fails it); ``corrupt_pool`` (``true``, or a mode of
``sim.emulator.corruption``: all, load, position, replica; with ``corrupt_load`` and
``corrupt_position``) makes replies that loaded KV from the shared pool differ from the
true ones (the study's corrupted-copy bug class, for validation tools to catch).
Chat and completions answer ``logprobs`` (non-streamed) as vLLM does (``sim.emulator.replies``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import orjson
from prometheus_client import generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from router.disconnect import ClientGone, unless_gone
from router.openai_api import lax_bool
from sim.emulator.corruption import DEFAULT_LOAD, DEFAULT_POSITION, CorruptPool, corrupt_mode
from sim.emulator.engine import ConstantEngine, Engine, TokenSchedule
from sim.emulator.metrics import ReplicaMetrics
from sim.emulator.replies import chat_logprobs, completion_logprobs, reply, requested_logprobs
from sim.emulator.tokens import prompt_token_ids, tokenize_text

Clock = Callable[[], float]
__all__ = ["ConstantEngine", "EmulatedReplica", "Engine", "Faults", "TokenSchedule",
           "create_replica_app"]


@dataclass
class Faults:
    http_status: int | None = None
    health_status: int | None = None
    break_after_chunks: int | None = None
    corrupt_pool: bool | str = False  # True is "all" (sim.emulator.corruption)
    poison: str | None = None
    corrupt_load: int = DEFAULT_LOAD
    corrupt_position: int = DEFAULT_POSITION

    def corruption(self) -> CorruptPool:
        return CorruptPool(corrupt_mode(self.corrupt_pool), self.corrupt_load,
                           self.corrupt_position)


_FAULT_KEYS = ("http_status", "health_status", "break_after_chunks", "corrupt_pool", "poison",
               "corrupt_load", "corrupt_position")


class BrokenStream(Exception):
    """Raised inside a streaming body to drop the connection (fault injection)."""


def _usage(prompt: int, completion: int, cached: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def _sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


class EmulatedReplica:
    """State and handlers of one emulated replica (one per app, no globals)."""

    def __init__(self, *, model: str, engine: Engine, time_scale: float = 1.0,
                 clock: Clock = time.monotonic, fixed_created: int | None = None,
                 max_model_len: int = 1_048_576, block_size: int = 16,
                 faults: Faults | None = None, start: float | None = None):
        if time_scale <= 0:
            raise ValueError("time_scale must be positive")
        self.model = model
        self.engine = engine
        self.time_scale = time_scale
        self.clock = clock
        self.fixed_created = fixed_created
        self.max_model_len = max_model_len
        self.faults = faults or Faults()
        self.metrics = ReplicaMetrics()
        self.metrics.describe_cache(block_size)
        self._labels = {"model_name": model, "engine": "0"}
        self.metrics.touch(self._labels)
        self._seq = 0
        self._prefilling = 0  # requests admitted and not yet at their first token
        self.loras: dict[str, str] = {}  # LoRA adapters loaded at run time: name -> path
        self._start = clock() if start is None else start  # a shared pool's epoch

    def serves(self, model: str) -> bool:
        return model == self.model or model in self.loras

    def model_now(self) -> float:
        """The engine's clock: model seconds since this replica started."""
        return (self.clock() - self._start) / self.time_scale

    def _lbl(self, metric: Any) -> Any:
        return metric.labels(**self._labels)

    def _created(self) -> int:
        return self.fixed_created if self.fixed_created is not None else int(time.time())

    def _request_id(self, request: Request, prefix: str) -> str:
        rid = request.headers.get("x-request-id")
        if rid:
            return f"{prefix}-{rid}"
        self._seq += 1
        return f"{prefix}-{self._seq:012d}"

    def _admissible(self, body: Any, endpoint: str) -> Response | None:
        """vLLM's answer to a body it refuses (400/404), or None to serve it."""
        if not isinstance(body, dict):
            return _error(400, "request body must be a JSON object")
        model = body.get("model", self.model)
        if model is not None and not self.serves(model):
            return _error(404, f"The model `{model}` does not exist.", "NotFoundError")
        if endpoint == "chat" and not isinstance(body.get("messages"), list):
            return _error(400, "'messages' is required")
        if endpoint == "completions" and body.get("prompt") is None \
                and body.get("prompt_embeds") is None:
            return _error(400, "Either prompt or prompt_embeds must be provided")
        salt = body.get("cache_salt")
        if salt is not None and (not isinstance(salt, str) or not salt):
            return _error(400, "Parameter 'cache_salt' must be a non-empty string if provided.")
        return None

    def _max_tokens(self, body: dict[str, Any], prompt_tokens: int) -> int | Response:
        raw = body.get("max_completion_tokens", body.get("max_tokens"))
        try:
            wanted = 16 if raw is None else int(float(raw))
        except (TypeError, ValueError):
            return _error(400, "max_tokens must be an integer")
        if wanted < 1:
            return _error(400, f"max_tokens must be at least 1, got {wanted}.")
        if wanted + prompt_tokens > self.max_model_len:
            return _error(400, f"This model's maximum context length is {self.max_model_len} "
                          f"tokens; {prompt_tokens} prompt + {wanted} output requested.")
        return wanted

    async def completion(self, request: Request, endpoint: str) -> Response:
        raw = await request.body()
        if self.faults.poison and self.faults.poison.encode() in raw:
            return Response(b"Internal Server Error", status_code=500, media_type="text/plain")
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return _error(400, "invalid JSON body")
        refused = self._admissible(body, endpoint)
        if refused is not None:
            return refused
        if self.faults.http_status is not None:
            return _error(self.faults.http_status, "emulated engine fault", "InternalServerError")
        ids = prompt_token_ids(endpoint, body)
        max_tokens = self._max_tokens(body, len(ids))
        if isinstance(max_tokens, Response):
            return max_tokens
        self._prefilling += 1
        busy = self._prefilling  # this one included: the corrupt-pool "load" mode's count
        try:
            plan = await self._prefill(ids, max_tokens, body.get("cache_salt"))
        finally:
            self._prefilling -= 1
        corrupt = self.faults.corruption().corrupts(plan, self.engine, busy)
        out = reply(ids, max_tokens, corrupt=corrupt, cached=plan.cached_tokens > 0)
        words, top = out.words, requested_logprobs(endpoint, body)
        rid = self._request_id(request, "chatcmpl" if endpoint == "chat" else "cmpl")
        done = self._done_callback(ids, len(words))
        if lax_bool(body.get("stream")):  # vLLM reads it as pydantic's lax bool
            opts = body.get("stream_options")
            opts = opts if isinstance(opts, dict) else {}
            usage = _usage(len(ids), len(words), plan.cached_tokens)
            chunks = self._chunks(endpoint, rid, words, plan, usage if opts.get("include_usage")
                                  else None, done)
            return StreamingResponse(chunks, media_type="text/event-stream")
        try:
            await asyncio.sleep(plan.tpot_s * self.time_scale * max(0, len(words) - 1))
        except asyncio.CancelledError:
            done("abort")
            raise
        done("length")
        text = "".join(words)
        choice: dict[str, Any]
        if endpoint == "chat":
            choice = {"index": 0, "message": {"role": "assistant", "content": text,
                                              "tool_calls": []}, "finish_reason": "length",
                      "logprobs": None if top is None else chat_logprobs(out, top)}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "finish_reason": "length",
                      "logprobs": None if top is None else completion_logprobs(out, top)}
            obj = "text_completion"
        return Response(orjson.dumps({
            "id": rid, "object": obj, "created": self._created(), "model": self.model,
            "choices": [choice], "usage": _usage(len(ids), len(words), plan.cached_tokens),
        }), media_type="application/json")

    async def _prefill(self, ids: list[int], max_tokens: int, salt: str | None) -> TokenSchedule:
        """Admit, count, and sleep until the first token (waiting, then running)."""
        m = self.metrics
        plan = self.engine.admit(ids, max_tokens, self.model_now(), salt)
        if plan.on_first_token is not None:
            # Scheduled, not awaited: the blocks are written even if the client goes away.
            asyncio.get_running_loop().call_later(plan.ttft_s * self.time_scale,
                                                  plan.on_first_token)
        self._lbl(m.kv_usage).set(self.engine.kv_usage())
        self._lbl(m.waiting).inc()
        try:
            await asyncio.sleep(plan.queue_s * self.time_scale)
        except asyncio.CancelledError:  # the client left while queued: vLLM aborts it
            self._lbl(m.waiting).dec()
            m.requests.labels(**self._labels, finished_reason="abort").inc()
            raise
        self._lbl(m.waiting).dec()
        self._lbl(m.running).inc()
        try:
            await asyncio.sleep((plan.ttft_s - plan.queue_s) * self.time_scale)
        except asyncio.CancelledError:
            self._lbl(m.running).dec()
            m.requests.labels(**self._labels, finished_reason="abort").inc()
            raise
        gpu_hit = plan.cached_tokens - plan.pool_hit_tokens
        self._lbl(m.prompt_tokens).inc(len(ids))
        self._lbl(m.prompt_tokens_cached).inc(plan.cached_tokens)
        self._lbl(m.prefix_queries).inc(len(ids))
        self._lbl(m.prefix_hits).inc(gpu_hit)
        self._lbl(m.external_queries).inc(len(ids) - gpu_hit)
        self._lbl(m.external_hits).inc(plan.pool_hit_tokens)
        self._lbl(m.ttft).observe(plan.ttft_s * self.time_scale)
        self._lbl(m.queue_time).observe(plan.queue_s * self.time_scale)
        return plan

    def _done_callback(self, ids: list[int], n_out: int) -> Callable[[str], None]:
        """``done(reason)`` ends the request once: ``length``, or ``abort`` (client gone)."""
        state = {"done": False}

        def done(reason: str) -> None:
            if state["done"]:
                return
            state["done"] = True
            self._lbl(self.metrics.running).dec()
            self._lbl(self.metrics.generation_tokens).inc(n_out)
            self.metrics.requests.labels(**self._labels, finished_reason=reason).inc()
            self._lbl(self.metrics.kv_usage).set(self.engine.kv_usage())

        return done

    async def _chunks(self, endpoint: str, rid: str, words: list[str], plan: TokenSchedule,
                      usage: dict[str, Any] | None, done: Callable[[str], None]
                      ) -> AsyncIterator[bytes]:
        created = self._created()
        obj = "chat.completion.chunk" if endpoint == "chat" else "text_completion"
        base = {"id": rid, "object": obj, "created": created, "model": self.model}
        finished = False
        try:
            if endpoint == "chat":
                yield _sse({**base, "choices": [{"index": 0, "delta": {"role": "assistant",
                            "content": ""}, "logprobs": None, "finish_reason": None}]})
            for i, word in enumerate(words):
                if self.faults.break_after_chunks is not None and i >= self.faults.break_after_chunks:
                    raise BrokenStream("emulated connection drop")
                if i:
                    await asyncio.sleep(plan.tpot_s * self.time_scale)
                last = i == len(words) - 1
                if endpoint == "chat":
                    choice: dict[str, Any] = {"index": 0, "delta": {"content": word},
                                              "logprobs": None,
                                              "finish_reason": "length" if last else None}
                else:
                    choice = {"index": 0, "text": word, "logprobs": None,
                              "finish_reason": "length" if last else None}
                yield _sse({**base, "choices": [choice]})
            if usage is not None:
                yield _sse({**base, "choices": [], "usage": usage})
            yield b"data: [DONE]\n\n"
            finished = True
        finally:
            done("length" if finished else "abort")

    async def models(self, request: Request) -> Response:
        return Response(orjson.dumps({"object": "list", "data": [{
            "id": self.model, "object": "model", "created": self._created(),
            "owned_by": "vllm", "root": self.model, "parent": None,
            "max_model_len": self.max_model_len}, *({
                "id": name, "object": "model", "created": self._created(), "owned_by": "vllm",
                "root": path, "parent": self.model, "max_model_len": self.max_model_len}
                for name, path in self.loras.items())]}), media_type="application/json")

    async def health(self, request: Request) -> Response:
        status = self.faults.health_status or 200
        return Response(b"", status_code=status)

    async def metrics_endpoint(self, request: Request) -> Response:
        return Response(generate_latest(self.metrics.registry),
                        media_type="text/plain; version=0.0.4; charset=utf-8")

    async def tokenize(self, request: Request) -> Response:
        try:
            body = orjson.loads(await request.body())
        except orjson.JSONDecodeError:
            return _error(400, "invalid JSON body")
        if "messages" in body:
            ids = prompt_token_ids("chat", body)
        else:
            ids = tokenize_text(str(body.get("prompt", "")))
        return Response(orjson.dumps({"count": len(ids), "max_model_len": self.max_model_len,
                                      "tokens": ids}), media_type="application/json")

    async def set_faults(self, request: Request) -> Response:
        data = orjson.loads(await request.body() or b"{}")
        faults = Faults(**{k: data[k] for k in _FAULT_KEYS if k in data})
        try:
            faults.corruption()
        except ValueError as exc:
            return _error(400, str(exc))
        self.faults = faults
        return Response(orjson.dumps({"faults": self.faults.__dict__}),
                        media_type="application/json")


def _error(status: int, message: str, type_: str = "BadRequestError") -> Response:
    # vLLM's error body: OpenAI-shaped, with the HTTP status as the code.
    return Response(orjson.dumps({"error": {"message": message, "type": type_, "param": None,
                                            "code": status}}),
                    status_code=status, media_type="application/json")


async def _abortable(request: Request, endpoint: str, replica: EmulatedReplica) -> Response:
    """Like vLLM's ``with_cancellation``: a client that disconnects before the reply
    starts cancels the handler (the request is counted ``finished_reason="abort"``)."""
    await request.body()  # cached: the watcher below only ever sees the disconnect
    try:
        return await unless_gone(replica.completion(request, endpoint), request.receive)
    except ClientGone:
        return Response(status_code=499)


def create_replica_app(replica: EmulatedReplica) -> Starlette:
    async def chat(request: Request) -> Response:
        return await _abortable(request, "chat", replica)

    async def completions(request: Request) -> Response:
        return await _abortable(request, "completions", replica)

    from sim.emulator.generate import Generating
    from sim.emulator.surface import ReplicaSurface

    surface = ReplicaSurface(replica)
    app = Starlette(routes=[
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/models", replica.models, methods=["GET"]),
        Route("/health", replica.health, methods=["GET"]),
        Route("/metrics", replica.metrics_endpoint, methods=["GET"]),
        Route("/tokenize", replica.tokenize, methods=["POST"]),
        Route("/_emulator/faults", replica.set_faults, methods=["POST"]),
        *surface.routes(),
        *Generating(surface).routes(),
    ])
    app.state.replica = replica
    return app
