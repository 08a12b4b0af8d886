"""The request path: read -> parse -> choose -> forward -> pass the reply through -> record.

One linear path, like Go's httputil.ReverseProxy:
1. read the body as bytes, refusing more than ``max_body_bytes`` (413) before parsing;
2. parse and validate it (``openai_api``; 400 on bad input), derive the session key;
   hash the prompt into prefix blocks and look up where they live (``locator``: one
   index round trip);
3. ask the policy for a replica among the healthy ones not yet tried;
4. send the original bytes with end-to-end headers (hop-by-hop stripped, X-Request-Id
   kept or created);
5. failover: a connect error, a 5xx, or a body that breaks while still buffered (non-stream
   replies are small and read whole before the client sees a byte) marks the replica and
   retries on another, up to ``max_attempts``; once bytes reached the client there is no
   retry — a stream that breaks mid-way ends with an SSE error event and a clean close;
6. the reply's status, end-to-end headers and bytes reach the client unchanged (SSE
   chunks flushed as they arrive), plus x-lmroute-replica / -policy / -reason (and -arm
   when an A/B ``split`` chose);
7. the policy observes the first byte (``phase="first_token"``, streams) and the end
   (``phase="done"``); TTFT = first body byte (the whole reply when not streamed); a
   successful reply records its prefix as held by the serving replica (and the pool).

The policy object is read once per request (``self.policy`` may be swapped by the admin
API between requests): every attempt's ``dispatched`` and ``observe`` go to the object
that chose it, so an in-flight request finishes against the policy that routed it.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from policies.base import Decision, NoReplicaAvailable, Outcome, Policy, RequestView
from router.errors import (
    BadRequest,
    LmrouteError,
    NoHealthyReplica,
    PayloadTooLarge,
    UpstreamConnectError,
    UpstreamError,
    UpstreamStreamBroken,
    sse_error_event,
)
from router.locator import Locator
from router.metrics import RouterMetrics
from router.openai_api import Endpoint, ParsedRequest, parse_request
from router.replicas import Replica, ReplicaSet
from router.upstream import Upstream, UpstreamResponse, end_to_end

Clock = Callable[[], float]
PATHS: dict[Endpoint, str] = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


async def read_body(request: Request, limit: int) -> bytes:
    """Read the whole body, refusing (413) as soon as it is known to exceed ``limit``."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise BadRequest("invalid Content-Length header")
        if int(declared) > limit:
            raise PayloadTooLarge(f"request body of {declared} bytes exceeds the {limit}-byte limit")
    parts: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"request body exceeds the {limit}-byte limit")
        parts.append(chunk)
    return b"".join(parts)


class _CleanupStream(StreamingResponse):
    """StreamingResponse whose cleanup runs even if the client vanished before the first chunk."""

    def __init__(self, content: AsyncIterator[bytes], status_code: int,
                 cleanup: Callable[[], Awaitable[None]]):
        super().__init__(content, status_code=status_code)
        self._cleanup = cleanup

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._cleanup()


@dataclass(slots=True)
class _Attempt:
    view: RequestView
    decision: Decision
    replica: Replica
    chain: list[int]
    policy: Policy


class Proxy:
    """Routes chat and completions requests; owns no I/O objects, only uses them."""

    def __init__(self, *, replicas: ReplicaSet, upstream: Upstream, policy: Policy,
                 locator: Locator, metrics: RouterMetrics, clock: Clock, max_body_bytes: int,
                 max_attempts: int):
        self.replicas = replicas
        self.locator = locator
        self.upstream = upstream
        self.policy = policy
        self.metrics = metrics
        self.clock = clock
        self.max_body_bytes = max_body_bytes
        self.max_attempts = max_attempts

    async def handle(self, endpoint: Endpoint, request: Request) -> Response:
        t0 = self.clock()
        request_id = request.headers.get("x-request-id") or uuid.uuid4().hex
        try:
            raw = await read_body(request, self.max_body_bytes)
            parsed = parse_request(endpoint, raw, request.headers.get("x-session-id"))
            return await self._route(parsed, raw, request, request_id, t0)
        except LmrouteError as err:  # rendered by the app's handler (router.routes)
            self.metrics.refused(err.code or err.type)
            err.request_id = request_id
            raise

    async def _view(self, parsed: ParsedRequest, chain: list[int], request_id: str,
                    now: float) -> RequestView:
        return RequestView(
            request_id=request_id,
            model=parsed.model,
            session=parsed.session,
            endpoint=parsed.endpoint,
            stream=parsed.stream,
            prompt_tokens=parsed.prompt_chars // 4,
            max_tokens=parsed.max_tokens,
            residency=await self.locator.residency(chain),
            last_replica=self.locator.last_replica(parsed.session),
            now=now,
        )

    async def _route(self, parsed: ParsedRequest, raw: bytes, request: Request,
                     request_id: str, t0: float) -> Response:
        headers = end_to_end((k.decode("latin-1"), v.decode("latin-1"))
                             for k, v in request.headers.raw)
        headers = [(k, v) for k, v in headers if k.lower() != "x-request-id"]
        headers.append(("x-request-id", request_id))
        chain = self.locator.chain(parsed)
        # Policy state keys on an internal id: the client's X-Request-Id is only echoed and
        # forwarded (two in-flight requests may share it).
        view = await self._view(parsed, chain, uuid.uuid4().hex, t0)
        policy = self.policy  # one object for the whole request, whatever the admin API does
        tried: set[str] = set()
        last_error: UpstreamError | None = None
        last_5xx: tuple[UpstreamResponse, bytes, _Attempt] | None = None
        for attempt_no in range(self.max_attempts):
            view = replace(view, exclude=frozenset(tried), now=self.clock())
            try:
                decision = policy.choose(view, self.replicas.views())
            except NoReplicaAvailable:
                break
            replica = self.replicas.by_id[decision.replica]
            attempt = _Attempt(view, decision, replica, chain, policy)
            tried.add(replica.id)
            if attempt_no:
                self.metrics.retry(replica.url, decision.arm)
            self.metrics.decision(policy.name, decision.reason, decision.arm)
            policy.dispatched(view, decision)
            replica.in_flight += 1
            if attempt_no == 0:
                self.metrics.routing_overhead(self.clock() - t0)
            try:
                resp = await self.upstream.send("POST", replica.url + PATHS[parsed.endpoint],
                                                headers, raw)
            except UpstreamConnectError as exc:
                self._failed(attempt, "connect", str(exc))
                last_error = exc
                continue
            if resp.status >= 500:
                body = await self._read_or_none(resp)
                self._failed(attempt, f"http_{resp.status}", f"answered {resp.status}")
                last_5xx = (resp, body or b"", attempt)
                continue
            if resp.is_event_stream:
                return self._stream(resp, attempt, request_id, t0)
            try:
                body = await resp.read()
            except UpstreamStreamBroken as exc:
                self._failed(attempt, "body", str(exc))
                last_error = exc
                continue
            self._finished(attempt, resp.status, t0, ttft=self.clock() - t0, ok=resp.status < 400)
            return self._buffered(resp, body, attempt, request_id)
        if last_5xx is not None:
            resp, body, attempt = last_5xx
            self.metrics.request_done(parsed.endpoint, attempt.replica.url, resp.status,
                                      attempt.decision.arm)
            return self._buffered(resp, body, attempt, request_id)
        if last_error is not None:
            raise UpstreamError(f"all {len(tried)} replicas tried failed; last: {last_error.message}")
        raise NoHealthyReplica("no healthy replica to route to")

    @staticmethod
    async def _read_or_none(resp: UpstreamResponse) -> bytes | None:
        try:
            return await resp.read()
        except UpstreamStreamBroken:
            return None

    def _failed(self, attempt: _Attempt, kind: str, error: str) -> None:
        attempt.replica.in_flight -= 1
        self.replicas.record_failure(attempt.replica, error)
        self.metrics.upstream_error(attempt.replica.url, kind, attempt.decision.arm)
        attempt.policy.observe(Outcome(attempt.view, attempt.decision, ok=False,
                                    at=self.clock()))

    def _finished(self, attempt: _Attempt, status: int, t0: float, *, ttft: float | None,
                  ok: bool) -> None:
        now = self.clock()
        attempt.replica.in_flight -= 1
        self.replicas.record_success(attempt.replica, from_probe=False)
        self.metrics.request_done(attempt.view.endpoint, attempt.replica.url, status,
                                  attempt.decision.arm, duration_s=now - t0, ttft_s=ttft,
                                  predicted_ttft_s=attempt.decision.predicted_ttft_s if ok else None)
        attempt.policy.observe(Outcome(attempt.view, attempt.decision, ok=ok, ttft_s=ttft,
                                    total_s=now - t0, at=now))
        if ok:
            self.locator.served(attempt.view.session, attempt.chain, attempt.replica.id)

    def _headers(self, resp: UpstreamResponse, attempt: _Attempt,
                 request_id: str) -> list[tuple[bytes, bytes]]:
        out = [(k.lower().encode("latin-1"), v.encode("latin-1"))
               for k, v in end_to_end(resp.headers) if k.lower() != "x-request-id"]
        out += [
            (b"x-request-id", request_id.encode("latin-1")),
            (b"x-lmroute-replica", attempt.replica.url.encode("latin-1")),
            (b"x-lmroute-policy", attempt.policy.name.encode("latin-1")),
            (b"x-lmroute-reason", attempt.decision.reason.encode("latin-1")),
        ]
        if attempt.decision.arm:
            out.append((b"x-lmroute-arm", attempt.decision.arm.encode("latin-1")))
        return out

    def _buffered(self, resp: UpstreamResponse, body: bytes, attempt: _Attempt,
                  request_id: str) -> Response:
        out = Response(body, status_code=resp.status)
        out.raw_headers = [*self._headers(resp, attempt, request_id),
                           (b"content-length", str(len(body)).encode())]
        return out

    def _stream(self, resp: UpstreamResponse, attempt: _Attempt, request_id: str,
                t0: float) -> Response:
        state: dict[str, float | bool | None] = {"ttft": None, "ok": True, "done": False}

        async def body() -> AsyncIterator[bytes]:
            try:
                async for chunk in resp.chunks():
                    if state["ttft"] is None:
                        now = self.clock()
                        state["ttft"] = now - t0
                        # The prefill is over: queue-aware policies free the replica now,
                        # not when the (long) decode ends.
                        attempt.policy.observe(Outcome(attempt.view, attempt.decision, ok=True,
                                                    ttft_s=now - t0, phase="first_token",
                                                    at=now))
                    yield chunk
            except UpstreamStreamBroken as exc:
                # Bytes already reached the client: no retry. End with an error event the
                # OpenAI SDKs raise on, then close the stream cleanly.
                state["ok"] = False
                self.metrics.upstream_error(attempt.replica.url, "mid_stream",
                                            attempt.decision.arm)
                yield sse_error_event(exc.message)

        async def cleanup() -> None:
            if state["done"]:
                return
            state["done"] = True
            resp.abort()
            ttft = state["ttft"]
            self._finished(attempt, resp.status, t0,
                           ttft=ttft if isinstance(ttft, float) else None,
                           ok=bool(state["ok"]) and resp.status < 400)

        out = _CleanupStream(body(), resp.status, cleanup)
        out.raw_headers = self._headers(resp, attempt, request_id)
        return out
