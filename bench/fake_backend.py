"""A fast, dependency-free fake of a vLLM OpenAI-compatible server, for benchmarks.

It is built on raw asyncio (``asyncio.start_server`` plus a minimal HTTP/1.1 keep-alive
parser, no web framework) so that it costs as little CPU per request as possible: a router
benchmarked against it measures the router, not the backend. With uvloop (used when it is
importable) it serves well over ten thousand small requests per second on one core.

Endpoints:

* ``POST /v1/chat/completions`` and ``POST /v1/completions``: a fixed completion of
  ``--tokens`` tokens (default 16). When the request body contains ``"stream": true`` the
  reply is an SSE stream (chunked transfer encoding) of one ``data: {...}`` event per token
  followed by ``data: [DONE]``; otherwise a single JSON object.
* ``GET /health``: 200, empty body.
* ``GET /v1/models``: the one served model.
* ``GET /metrics``: a few vLLM-named Prometheus gauges (``vllm:num_requests_running``,
  ``vllm:num_requests_waiting``, ``vllm:kv_cache_usage_perc``, labelled ``model_name`` and
  ``engine``). ``num_requests_running`` is the number of completion requests in flight;
  ``kv_cache_usage_perc`` is that number over ``--max-num-seqs`` (capped at 1.0).

Everything else answers 404 (unknown path) or 405 (known path, wrong method).

Usage::

    python bench/fake_backend.py --port 8001 [--host 127.0.0.1] [--token-delay 0.0]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field

_STREAM_RE = re.compile(rb'"stream"\s*:\s*true')
_MAX_HEADER_BYTES = 64 * 1024
_MAX_BODY_BYTES = 64 * 1024 * 1024

_REASONS: dict[int, bytes] = {
    200: b"OK",
    400: b"Bad Request",
    404: b"Not Found",
    405: b"Method Not Allowed",
    413: b"Payload Too Large",
}


class BadRequest(Exception):
    """The client sent something this minimal parser will not handle."""


@dataclass(frozen=True)
class Request:
    """One parsed HTTP/1.1 request."""

    method: str
    path: str
    body: bytes
    keep_alive: bool


def _response(
    status: int,
    body: bytes,
    content_type: bytes = b"application/json",
    keep_alive: bool = True,
) -> bytes:
    """Serialise a complete (Content-Length delimited) HTTP/1.1 response."""
    head = b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n%s\r\n" % (
        status,
        _REASONS.get(status, b"Unknown"),
        content_type,
        len(body),
        b"" if keep_alive else b"Connection: close\r\n",
    )
    return head + body


def _chunk(payload: bytes) -> bytes:
    """Frame ``payload`` as one chunk of a chunked transfer-encoded body."""
    return b"%x\r\n%s\r\n" % (len(payload), payload)


@dataclass
class FakeBackend:
    """Pre-rendered replies plus the tiny amount of state the /metrics endpoint reports."""

    model: str = "fake-model"
    tokens: int = 16
    token_delay: float = 0.0
    max_num_seqs: int = 256
    running: int = 0
    served: int = 0
    _bodies: dict[str, bytes] = field(default_factory=dict)
    _stream_frames: dict[str, list[bytes]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        created = int(time.time())
        text = "".join(f" tok{i}" for i in range(self.tokens))
        usage = {
            "prompt_tokens": 8,
            "completion_tokens": self.tokens,
            "total_tokens": 8 + self.tokens,
        }
        chat = {
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "created": created,
            "model": self.model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "logprobs": None,
                    "finish_reason": "length",
                }
            ],
            "usage": usage,
        }
        completion = {
            "id": "cmpl-fake",
            "object": "text_completion",
            "created": created,
            "model": self.model,
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}],
            "usage": usage,
        }
        self._bodies["/v1/chat/completions"] = _dumps(chat)
        self._bodies["/v1/completions"] = _dumps(completion)
        self._stream_frames["/v1/chat/completions"] = self._render_stream(chat=True)
        self._stream_frames["/v1/completions"] = self._render_stream(chat=False)
        self._bodies["/v1/models"] = _dumps(
            {
                "object": "list",
                "data": [{"id": self.model, "object": "model", "created": created, "owned_by": "fake"}],
            }
        )

    def _render_stream(self, *, chat: bool) -> list[bytes]:
        """One chunked-encoding frame per SSE event, the terminating frame included."""
        frames: list[bytes] = []
        for i in range(self.tokens):
            last = i == self.tokens - 1
            choice: dict[str, object]
            if chat:
                delta: dict[str, str] = {"content": f" tok{i}"}
                if i == 0:
                    delta["role"] = "assistant"
                choice = {"index": 0, "delta": delta, "logprobs": None}
            else:
                choice = {"index": 0, "text": f" tok{i}", "logprobs": None}
            choice["finish_reason"] = "length" if last else None
            event = {
                "id": "chatcmpl-fake" if chat else "cmpl-fake",
                "object": "chat.completion.chunk" if chat else "text_completion",
                "created": 0,
                "model": self.model,
                "choices": [choice],
            }
            frames.append(_chunk(b"data: " + _dumps(event) + b"\n\n"))
        frames.append(_chunk(b"data: [DONE]\n\n"))
        frames.append(b"0\r\n\r\n")
        return frames

    def metrics(self) -> bytes:
        """Prometheus text exposition of the vLLM gauges a router scrapes."""
        labels = f'engine="0",model_name="{self.model}"'
        usage = min(1.0, self.running / self.max_num_seqs) if self.max_num_seqs else 0.0
        lines = [
            "# HELP vllm:num_requests_running Number of requests in model execution batches.",
            "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running{{{labels}}} {float(self.running)}",
            "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
            "# TYPE vllm:num_requests_waiting gauge",
            f"vllm:num_requests_waiting{{{labels}}} 0.0",
            "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.",
            "# TYPE vllm:kv_cache_usage_perc gauge",
            f"vllm:kv_cache_usage_perc{{{labels}}} {usage}",
            "",
        ]
        return "\n".join(lines).encode()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Serve one keep-alive connection until the peer closes it or asks us to."""
        try:
            while True:
                try:
                    req = await _read_request(reader)
                except BadRequest as exc:
                    writer.write(_response(400, str(exc).encode(), b"text/plain", False))
                    return
                if req is None:
                    return
                await self._dispatch(req, writer)
                if not req.keep_alive:
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def _dispatch(self, req: Request, writer: asyncio.StreamWriter) -> None:
        path = req.path.split("?", 1)[0]
        ka = req.keep_alive
        if path in self._stream_frames:
            if req.method != "POST":
                writer.write(_response(405, b"", keep_alive=ka))
                return
            self.served += 1
            if _STREAM_RE.search(req.body):
                await self._stream(path, writer, ka)
            else:
                writer.write(_response(200, self._bodies[path], keep_alive=ka))
            return
        if req.method != "GET":
            status = 405 if path in ("/health", "/v1/models", "/metrics") else 404
            writer.write(_response(status, b"", keep_alive=ka))
        elif path == "/health":
            writer.write(_response(200, b"", b"text/plain", ka))
        elif path == "/v1/models":
            writer.write(_response(200, self._bodies[path], keep_alive=ka))
        elif path == "/metrics":
            writer.write(_response(200, self.metrics(), b"text/plain; version=0.0.4", ka))
        else:
            writer.write(_response(404, b'{"error":"not found"}', keep_alive=ka))

    async def _stream(self, path: str, writer: asyncio.StreamWriter, keep_alive: bool) -> None:
        """Write the SSE reply, one ``write`` per event (uvloop sends each one at once)."""
        self.running += 1
        try:
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                b"Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n"
                + (b"" if keep_alive else b"Connection: close\r\n")
                + b"\r\n"
            )
            frames = self._stream_frames[path]
            if self.token_delay > 0:
                for frame in frames:
                    await asyncio.sleep(self.token_delay)
                    # The client may leave mid-stream (wrk at its deadline); uvloop raises
                    # RuntimeError, not ConnectionError, on a write to a closed transport.
                    if writer.is_closing():
                        return
                    writer.write(frame)
                    await writer.drain()
            else:
                for frame in frames:
                    writer.write(frame)
                await writer.drain()
        finally:
            self.running -= 1


async def _read_request(reader: asyncio.StreamReader) -> Request | None:
    """Parse one request; ``None`` on a clean EOF between requests."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if exc.partial.strip():
            raise BadRequest("truncated request head") from exc
        return None
    except asyncio.LimitOverrunError as exc:
        raise BadRequest("request head too large") from exc
    lines = head[:-4].split(b"\r\n")
    try:
        method, target, version = lines[0].decode("latin-1").split(" ", 2)
    except ValueError as exc:
        raise BadRequest("malformed request line") from exc
    content_length = 0
    chunked = False
    connection = b""
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            try:
                content_length = int(value)
            except ValueError as exc:
                raise BadRequest("bad Content-Length") from exc
        elif name == b"transfer-encoding":
            chunked = b"chunked" in value.lower()
        elif name == b"connection":
            connection = value.strip().lower()
    # HTTP/1.1 keeps the connection open unless told otherwise; HTTP/1.0 only when asked.
    keep_alive = connection == b"keep-alive" if version == "HTTP/1.0" else connection != b"close"
    if chunked:
        body = await _read_chunked(reader)
    elif content_length:
        if content_length > _MAX_BODY_BYTES or content_length < 0:
            raise BadRequest("body too large")
        body = await reader.readexactly(content_length)
    else:
        body = b""
    return Request(method=method, path=target, body=body, keep_alive=keep_alive)


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    """Read a chunked transfer-encoded request body (trailers are discarded)."""
    parts: list[bytes] = []
    total = 0
    while True:
        size_line = await reader.readuntil(b"\r\n")
        try:
            size = int(size_line.split(b";", 1)[0].strip(), 16)
        except ValueError as exc:
            raise BadRequest("bad chunk size") from exc
        if size == 0:
            while (await reader.readuntil(b"\r\n")) != b"\r\n":
                pass
            return b"".join(parts)
        total += size
        if total > _MAX_BODY_BYTES:
            raise BadRequest("body too large")
        parts.append(await reader.readexactly(size))
        await reader.readexactly(2)


def _dumps(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


async def serve(host: str, port: int, backend: FakeBackend) -> None:
    """Serve until SIGINT or SIGTERM."""
    server = await asyncio.start_server(
        backend.handle, host, port, limit=_MAX_HEADER_BYTES, backlog=4096
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()


def _loop_factory(use_uvloop: bool) -> Callable[[], asyncio.AbstractEventLoop] | None:
    if not use_uvloop:
        return None
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model", default="fake-model")
    parser.add_argument("--tokens", type=int, default=16, help="completion tokens per reply")
    parser.add_argument(
        "--token-delay", type=float, default=0.0, help="seconds between SSE events (default 0)"
    )
    parser.add_argument("--max-num-seqs", type=int, default=256, help="for kv_cache_usage_perc")
    parser.add_argument("--no-uvloop", action="store_true", help="use the stdlib event loop")
    args = parser.parse_args(argv)
    backend = FakeBackend(
        model=args.model,
        tokens=args.tokens,
        token_delay=args.token_delay,
        max_num_seqs=args.max_num_seqs,
    )
    with asyncio.Runner(loop_factory=_loop_factory(not args.no_uvloop)) as runner:
        runner.run(serve(args.host, args.port, backend))


if __name__ == "__main__":
    main()
