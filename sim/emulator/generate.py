"""The emulated replica's other generating routes, in vLLM 0.32's shapes.

``POST /v1/responses`` (OpenAI Responses: ``input`` a string or message items,
``instructions`` as the system message; streamed as vLLM's typed events
``event: response.created`` ... ``response.completed``), with the stored response's
``GET /v1/responses/{id}``, ``DELETE`` and ``POST .../cancel`` (a ``background`` response
runs as a task and can be cancelled; cancelling a finished one is vLLM's 400).
``POST /v1/messages`` (Anthropic Messages as vLLM serves it: ``message_start`` ...
``message_stop``) and ``/v1/messages/count_tokens``. ``POST /v1/audio/transcriptions``
and ``/translations``: multipart uploads (``file``, ``model``, ``stream``...), the reply a
pure function of the file's bytes (``{"text", "usage"}``; streamed as
``transcription.chunk`` SSE and ``[DONE]``).

Prompts go through the replica's chat template and engine (``_prefill``): timing,
metrics and the prefix cache behave as for chat completions.
"""

from __future__ import annotations

import asyncio
import email.parser
from collections.abc import AsyncIterator
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from router.openai_api import lax_bool
from sim.emulator.surface import ReplicaSurface, json_response, vllm_error
from sim.emulator.tokens import render_chat, reply_words, tokenize_text


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def response_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """A Responses body as chat messages (``instructions`` first, as vLLM renders them)."""
    out: list[dict[str, Any]] = []
    if isinstance(body.get("instructions"), str):
        out.append({"role": "system", "content": body["instructions"]})
    items = body.get("input")
    if isinstance(items, str):
        return [*out, {"role": "user", "content": items}]
    for item in items if isinstance(items, list) else []:
        if isinstance(item, dict) and "role" in item:
            out.append({"role": item["role"], "content": _text(item.get("content"))})
    return out


def anthropic_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    system = body.get("system")
    out: list[dict[str, Any]] = [{"role": "system", "content": _text(system)}] if system else []
    for m in body.get("messages") or []:
        if isinstance(m, dict):
            out.append({"role": m.get("role"), "content": _text(m.get("content"))})
    return out


def _event(name: str, data: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


class Generating:
    """Responses, Messages and audio routes of one emulated replica."""

    def __init__(self, surface: ReplicaSurface) -> None:
        self.surface = surface
        self.replica = surface.replica
        self.stored: dict[str, dict[str, Any]] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def _too_long(self, messages: list[dict[str, Any]], max_tokens: Any) -> Response | None:
        """vLLM's 400 when prompt + output exceed the context (checked before generating)."""
        n = max_tokens if isinstance(max_tokens, int) and max_tokens > 0 else 16
        prompt = len(tokenize_text(render_chat(messages)))
        if prompt + n <= self.replica.max_model_len:
            return None
        return vllm_error(400, f"This model's maximum context length is "
                          f"{self.replica.max_model_len} tokens; {prompt} prompt + {n} output "
                          "requested.")

    async def _words(self, messages: list[dict[str, Any]], max_tokens: Any
                     ) -> tuple[list[int], list[str], float]:
        ids = tokenize_text(render_chat(messages))
        n = max_tokens if isinstance(max_tokens, int) and max_tokens > 0 else 16
        plan = await self.replica._prefill(ids, n, None)
        self.replica._done_callback(ids, n)("length")
        return ids, reply_words(ids, n), plan.tpot_s * self.replica.time_scale

    # -- /v1/responses -------------------------------------------------------------------
    def _response(self, rid: str, body: dict[str, Any], text: str | None, n_in: int,
                  n_out: int, status: str) -> dict[str, Any]:
        content: list[dict[str, Any]] = [] if text is None else [
            {"type": "output_text", "text": text, "annotations": [], "logprobs": None}]
        output = [] if text is None else [
            {"id": "msg_" + rid[5:], "type": "message", "role": "assistant",
             "status": "completed", "content": content}]
        return {"id": rid, "object": "response", "created_at": self.replica._created(),
                "model": self.replica.model, "status": status, "output": output,
                "usage": {"input_tokens": n_in, "input_tokens_details": {"cached_tokens": 0},
                          "output_tokens": n_out,
                          "output_tokens_details": {"reasoning_tokens": 0},
                          "total_tokens": n_in + n_out},
                "background": bool(body.get("background")), "error": None,
                "incomplete_details": None, "instructions": body.get("instructions"),
                "max_output_tokens": body.get("max_output_tokens"), "metadata": None,
                "parallel_tool_calls": True, "previous_response_id": None,
                "temperature": 1.0, "tool_choice": "auto", "tools": [], "top_p": 1.0,
                "text": {"format": {"type": "text"}}, "truncation": "disabled", "user": None}

    async def responses(self, request: Request) -> Response:
        body = await self.surface.body(request)
        if isinstance(body, Response):
            return body
        messages = response_messages(body)
        if not messages:
            return vllm_error(400, "'input' is required")
        too_long = self._too_long(messages, body.get("max_output_tokens"))
        if too_long is not None:
            return too_long
        rid = "resp_" + self.surface.rid("r", request).replace("-", "")
        if body.get("background"):
            self.stored[rid] = self._response(rid, body, None, 0, 0, "in_progress")
            self._tasks[rid] = asyncio.create_task(self._background(rid, body, messages))
            return json_response(self.stored[rid])
        ids, words, tpot = await self._words(messages, body.get("max_output_tokens"))
        done = self._response(rid, body, "".join(words), len(ids), len(words), "completed")
        self.stored[rid] = done
        if not lax_bool(body.get("stream")):
            return json_response(done)
        return StreamingResponse(self._response_events(done, words, tpot),
                                 media_type="text/event-stream")

    async def _background(self, rid: str, body: dict[str, Any],
                          messages: list[dict[str, Any]]) -> None:
        ids, words, tpot = await self._words(messages, body.get("max_output_tokens"))
        await asyncio.sleep(tpot * len(words))
        self.stored[rid] = self._response(rid, body, "".join(words), len(ids), len(words),
                                          "completed")

    async def _response_events(self, done: dict[str, Any], words: list[str],
                               tpot: float) -> AsyncIterator[bytes]:
        item = done["output"][0]
        part = item["content"][0]
        started = {**done, "status": "in_progress", "output": []}
        seq = iter(range(1_000_000))
        yield _event("response.created", {"type": "response.created", "sequence_number":
                                          next(seq), "response": started})
        yield _event("response.in_progress", {"type": "response.in_progress",
                                              "sequence_number": next(seq), "response": started})
        at = {"output_index": 0, "item_id": item["id"], "content_index": 0}
        yield _event("response.output_item.added", {
            "type": "response.output_item.added", "sequence_number": next(seq),
            "output_index": 0, "item": {**item, "status": "in_progress", "content": []}})
        yield _event("response.content_part.added", {
            "type": "response.content_part.added", "sequence_number": next(seq), **at,
            "part": {**part, "text": ""}})
        for i, word in enumerate(words):
            if i:
                await asyncio.sleep(tpot)
            yield _event("response.output_text.delta", {
                "type": "response.output_text.delta", "sequence_number": next(seq), **at,
                "delta": word, "logprobs": []})
        yield _event("response.output_text.done", {
            "type": "response.output_text.done", "sequence_number": next(seq), **at,
            "text": part["text"], "logprobs": []})
        yield _event("response.content_part.done", {
            "type": "response.content_part.done", "sequence_number": next(seq), **at,
            "part": part})
        yield _event("response.output_item.done", {
            "type": "response.output_item.done", "sequence_number": next(seq),
            "output_index": 0, "item": item})
        yield _event("response.completed", {"type": "response.completed",
                                            "sequence_number": next(seq), "response": done})

    def _stored(self, request: Request) -> tuple[str, dict[str, Any] | None]:
        rid = str(request.path_params["response_id"])
        return rid, self.stored.get(rid)

    async def get_response(self, request: Request) -> Response:
        rid, found = self._stored(request)
        if found is None:
            return vllm_error(404, f"Response with id '{rid}' not found.", "invalid_request_error")
        return json_response(found)

    async def delete_response(self, request: Request) -> Response:
        rid, found = self._stored(request)
        if found is None:
            return vllm_error(404, f"Response with id '{rid}' not found.", "invalid_request_error")
        del self.stored[rid]
        return json_response({"id": rid, "object": "response", "deleted": True})

    async def cancel_response(self, request: Request) -> Response:
        rid, found = self._stored(request)
        if found is None:
            return vllm_error(404, f"Response with id '{rid}' not found.", "invalid_request_error")
        task = self._tasks.pop(rid, None)
        if task is None or task.done():
            return vllm_error(400, "Cannot cancel a synchronous response.",
                              "invalid_request_error")
        task.cancel()
        self.stored[rid] = {**found, "status": "cancelled"}
        return json_response(self.stored[rid])

    # -- /v1/messages --------------------------------------------------------------------
    async def messages(self, request: Request) -> Response:
        body = await self.surface.body(request)
        if isinstance(body, Response):
            return body
        if not isinstance(body.get("messages"), list):
            return vllm_error(400, "'messages' is required")
        too_long = self._too_long(anthropic_messages(body), body.get("max_tokens"))
        if too_long is not None:
            return too_long
        ids, words, tpot = await self._words(anthropic_messages(body), body.get("max_tokens"))
        mid = "msg_" + self.surface.rid("m", request).replace("-", "")
        msg = {"id": mid, "type": "message", "role": "assistant", "model": self.replica.model,
               "content": [{"type": "text", "text": "".join(words)}],
               "stop_reason": "max_tokens", "stop_sequence": None,
               "usage": {"input_tokens": len(ids), "output_tokens": len(words)}}
        if not lax_bool(body.get("stream")):
            return json_response(msg)
        return StreamingResponse(self._message_events(msg, words, tpot),
                                 media_type="text/event-stream")

    async def _message_events(self, msg: dict[str, Any], words: list[str],
                              tpot: float) -> AsyncIterator[bytes]:
        start = {**msg, "content": [], "stop_reason": None,
                 "usage": {"input_tokens": msg["usage"]["input_tokens"], "output_tokens": 0}}
        yield _event("message_start", {"type": "message_start", "message": start})
        yield _event("content_block_start", {"type": "content_block_start", "index": 0,
                                             "content_block": {"type": "text", "text": ""}})
        for i, word in enumerate(words):
            if i:
                await asyncio.sleep(tpot)
            yield _event("content_block_delta", {"type": "content_block_delta", "index": 0,
                                                 "delta": {"type": "text_delta", "text": word}})
        yield _event("content_block_stop", {"type": "content_block_stop", "index": 0})
        yield _event("message_delta", {"type": "message_delta",
                                       "delta": {"stop_reason": "max_tokens",
                                                 "stop_sequence": None},
                                       "usage": {"output_tokens": len(words)}})
        yield _event("message_stop", {"type": "message_stop"})

    async def count_tokens(self, request: Request) -> Response:
        body = await self.surface.body(request)
        if isinstance(body, Response):
            return body
        return json_response({"input_tokens": len(tokenize_text(
            render_chat(anthropic_messages(body))))})

    # -- audio ---------------------------------------------------------------------------
    async def audio(self, request: Request, kind: str) -> Response:
        form = parse_form(request.headers.get("content-type", ""), await request.body())
        faulty = self.surface.fault()  # after the upload was read: a replay is needed
        if faulty is not None:
            return faulty
        if "file" not in form:
            return vllm_error(400, "'file' is required (multipart/form-data)")
        model = form.get("model", b"").decode() or None
        if model is not None and not self.replica.serves(model):
            return vllm_error(404, f"The model `{model}` does not exist.", "NotFoundError",
                              "model")
        ids = tokenize_text(form["file"].hex()[:4096])
        words = reply_words(ids, 8)
        seconds = max(1, len(form["file"]) // 32_000)
        if form.get("stream", b"").decode().lower() != "true":
            if form.get("response_format", b"json") == b"text":
                return Response("".join(words), media_type="text/plain")
            return json_response({"text": "".join(words),
                                  "usage": {"type": "duration", "seconds": seconds}})
        return StreamingResponse(self._audio_chunks(kind, words, request),
                                 media_type="text/event-stream")

    async def _audio_chunks(self, kind: str, words: list[str],
                            request: Request) -> AsyncIterator[bytes]:
        prefix = "trsc" if kind == "transcription" else "trsl"
        base = {"id": self.surface.rid(prefix, request), "object": f"{kind}.chunk",
                "created": self.replica._created(), "model": self.replica.model}
        for i, word in enumerate(words):
            last = i == len(words) - 1
            yield b"data: " + orjson.dumps({**base, "choices": [{
                "delta": {"content": word}, "finish_reason": "length" if last else None,
                "stop_reason": None}]}) + b"\n\n"
        yield b"data: [DONE]\n\n"

    def routes(self) -> list[Route]:
        async def transcriptions(request: Request) -> Response:
            return await self.audio(request, "transcription")

        async def translations(request: Request) -> Response:
            return await self.audio(request, "translation")

        return [Route("/v1/responses", self.responses, methods=["POST"]),
                Route("/v1/responses/{response_id}", self.get_response, methods=["GET"]),
                Route("/v1/responses/{response_id}", self.delete_response, methods=["DELETE"]),
                Route("/v1/responses/{response_id}/cancel", self.cancel_response,
                      methods=["POST"]),
                Route("/v1/messages", self.messages, methods=["POST"]),
                Route("/v1/messages/count_tokens", self.count_tokens, methods=["POST"]),
                Route("/v1/audio/transcriptions", transcriptions, methods=["POST"]),
                Route("/v1/audio/translations", translations, methods=["POST"])]


def parse_form(content_type: str, data: bytes) -> dict[str, bytes]:
    """A multipart/form-data body's fields (the emulator's only; the router never parses
    uploads beyond their ``model`` field, ``router.upload``)."""
    if not content_type.startswith("multipart/form-data"):
        return {}
    message = email.parser.BytesParser().parsebytes(
        b"Content-Type: " + content_type.encode() + b"\r\n\r\n" + data)
    out: dict[str, bytes] = {}
    for part in message.walk():
        name = part.get_param("name", header="content-disposition")
        if isinstance(name, str):
            payload = part.get_payload(decode=True)
            out[name] = payload if isinstance(payload, bytes) else b""
    return out
