"""The request path: read -> parse -> choose -> forward -> pass the reply through -> record.

One linear path, like Go's httputil.ReverseProxy:
1. read the body as bytes, refusing more than ``max_body_bytes`` (413) before parsing;
2. parse and validate it (``openai_api``; 400 on bad input), derive the session key;
   hash the prompt into prefix blocks and look up where they live (``locator``: one
   index round trip);
3. ask the policy for a replica among the healthy ones not yet tried;
4. send the original bytes with end-to-end headers (hop-by-hop stripped, X-Request-Id
   kept or created);
5. failover: a connect error, a gateway 5xx, or a body that breaks while still buffered
   (non-stream replies are small and read whole before the client sees a byte) marks the
   replica and retries on another, up to ``max_attempts``; a 5xx that may be the request's
   fault (``router.failures``) is retried once elsewhere without counting against the
   replica, and a second one ends the request with that error, OpenAI-shaped; once bytes
   reached the client there is no retry — a stream that breaks mid-way ends with an SSE
   error event and a clean close;
6. the reply's status, end-to-end headers and bytes reach the client unchanged (SSE
   chunks flushed as they arrive), plus x-lmroute-replica / -policy / -reason (and -arm
   when an A/B ``split`` chose);
7. the policy observes the first byte (``phase="first_token"``, streams) and the end
   (``phase="done"``); TTFT = first body byte (the whole reply when not streamed); a
   successful reply records its prefix as held by the serving replica (and the pool).
   What a reply leaves behind (metrics, the policy's observation, the prefix index) is
   recorded once the reply is on its way (``_after_reply``): a policy that calibrates
   (``locality``: ~30 us) is not between the replica's bytes and the client's. A
   failure's outcome is observed at once (the retry's choice reads it).

The policy object is read once per request (``self.policy`` may be swapped by the admin
API between requests): every attempt's ``dispatched`` and ``observe`` go to the object
that chose it, so an in-flight request finishes against the policy that routed it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, Awaitable, Callable
from dataclasses import dataclass, replace

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Scope

from policies.base import (
    Decision,
    NoReplicaAvailable,
    Outcome,
    Policy,
    ReplicaView,
    RequestView,
    anchor_key,
)
from router.bodies import read_body
from router.disconnect import CLIENT_CLOSED, ClientGone, mark_gone, unless_gone
from router.errors import (
    LmrouteError,
    NoHealthyReplica,
    UpstreamConnectError,
    UpstreamError,
    UpstreamStreamBroken,
)
from router.failures import Verdict, classify, shaped
from router.headers import header
from router.ids import new_id
from router.locator import Locator
from router.metrics import RouterMetrics
from router.openai_api import Endpoint, ParsedRequest, parse_request
from router.relay import Relay
from router.replicas import Replica, ReplicaSet
from router.upstream import Upstream, UpstreamResponse, end_to_end_raw, request_headers
from router.usage import engine_usage

Clock = Callable[[], float]
PATHS: dict[Endpoint, str] = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
# The client's X-Request-Id is echoed, not forwarded: the replica gets the router's id.
_OWN_ID = frozenset({b"x-request-id"})


@dataclass(frozen=True, slots=True)
class Target:
    """What each attempt sends: ``body`` is bytes, or a factory of a fresh stream per attempt
    (a streamed upload replayed on failover, ``router.upload``)."""

    method: str
    path: str  # with its query string
    body: bytes | Callable[[], AsyncIterable[bytes]] | None

    def payload(self) -> bytes | AsyncIterable[bytes] | None:
        return self.body() if callable(self.body) else self.body


# A pass-through route's parse: the request -> what routing needs, and what to send.
Prepare = Callable[[Request], Awaitable[tuple[ParsedRequest, Target]]]


def _after_reply(callback: Callable[..., None], *args: object) -> None:
    """``callback(*args)`` once this task yields: the reply it is about is sent first (a
    buffered reply's bytes and a stream's event go out before the task waits again), so
    the client does not wait for the router's bookkeeping. Callbacks keep their order
    (the loop runs them first in, first out)."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # driven without a loop (a bench stepping the proxy by hand)
        callback(*args)
        return
    loop.call_soon(callback, *args)


@dataclass(slots=True)
class _Attempt:
    view: RequestView
    decision: Decision
    replica: Replica
    chain: list[int]
    policy: Policy
    open: bool = True  # counted in the replica's in_flight, outcome not yet observed


@dataclass(slots=True)
class _Fault:
    """A 5xx answer and ``router.failures``' verdict on it (``body`` None: it broke)."""

    resp: UpstreamResponse
    body: bytes | None
    attempt: _Attempt
    verdict: Verdict


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
        # The replicas a request may go to (``router.models``: its model, drains, pins).
        self.candidates: Callable[[ParsedRequest], list[ReplicaView]] = \
            lambda parsed: self.replicas.views()

    async def handle(self, endpoint: Endpoint, request: Request,
                     prepare: Prepare | None = None) -> Response:
        """Route one request: chat/completions, or a pass-through route's ``prepare``."""
        t0 = self.clock()
        request_id = header(request, b"x-request-id") or new_id()
        live: list[_Attempt] = []  # the attempts made: the last may be open when the client left
        try:
            if prepare is None:
                raw = await read_body(request, self.max_body_bytes)
                parsed = parse_request(endpoint, raw, header(request, b"x-session-id"))
                target = Target("POST", PATHS[endpoint], raw)
            else:
                parsed, target = await prepare(request)
            return await unless_gone(self._route(parsed, target, request, request_id, t0, live),
                                     request.receive)
        except ClientGone:
            if live and live[-1].open:
                self._abandoned(live[-1])
            self.metrics.client_disconnect("before_reply")
            mark_gone(request.scope)
            return Response(status_code=CLIENT_CLOSED)
        except LmrouteError as err:  # rendered by the app's handler (router.routes)
            self.metrics.refused(err.code or err.type)
            err.request_id = request_id
            raise

    async def _view(self, parsed: ParsedRequest, chain: list[int], tokens: int,
                    request_id: str) -> RequestView:
        residency = await self.locator.residency(chain)
        return RequestView(
            request_id=request_id,
            model=parsed.model,
            session=parsed.session,
            endpoint=parsed.route,
            stream=parsed.stream,
            prompt_tokens=tokens,
            max_tokens=parsed.max_tokens,
            residency=residency,
            last_replica=self.locator.last_replica(parsed.session),
            now=self.clock(),  # after the lookup, which may wait on Redis
            anchor=anchor_key(chain, residency.block_tokens),
            generates=parsed.hashed,
        )

    async def _route(self, parsed: ParsedRequest, target: Target, request: Request,
                     request_id: str, t0: float, live: list[_Attempt]) -> Response:
        headers = request_headers(request.scope["headers"], drop=_OWN_ID)
        headers.append((b"x-request-id", request_id.encode("latin-1")))
        chain, tokens = self.locator.prompt_chain(parsed)
        # Policy state keys on an internal id: the client's X-Request-Id is only echoed and
        # forwarded (two in-flight requests may share it).
        view = await self._view(parsed, chain, tokens, new_id())
        policy = self.policy  # one object for the whole request, whatever the admin API does
        tried: set[str] = set()
        last_error: UpstreamError | None = None
        fault: _Fault | None = None  # the last 5xx, and whether its replica was blamed
        blamed = 0  # 5xx answers not blamed on the replica: the request's second one ends it
        for attempt_no in range(self.max_attempts):
            if attempt_no:  # dataclasses.replace is slow: only a retry pays for it
                view = replace(view, exclude=frozenset(tried), now=self.clock())
            try:
                attempt = self._dispatch(view, policy, chain, self.candidates(parsed),
                                         retry=bool(attempt_no))
            except NoReplicaAvailable:
                break
            live.append(attempt)
            tried.add(attempt.replica.id)
            if attempt_no == 0:
                self.metrics.routing_overhead(self.clock() - t0)
            try:
                resp = await self.upstream.send(target.method, attempt.replica.url + target.path,
                                                headers, target.payload())
            except UpstreamConnectError as exc:
                self._failed(attempt, "connect", str(exc))
                last_error = exc
                continue
            if resp.status >= 500:
                fault = await self._fault(resp, attempt)
                blamed += fault.verdict != "replica"
                if blamed >= 2:  # a second replica failed it too: the request's fault
                    break
                continue
            if resp.is_event_stream:
                self._acquit(fault, resp.status)
                return self._stream(resp, attempt, request_id, t0, request.scope)
            try:
                body = await resp.read()
            except UpstreamStreamBroken as exc:
                self._failed(attempt, "body", str(exc))
                last_error = exc
                continue
            self._acquit(fault, resp.status)
            self._finished(attempt, resp.status, t0, ttft=self.clock() - t0, ok=resp.status < 400,
                           tail=body)
            return self._buffered(resp, body, attempt, request_id)
        if fault is not None:
            self.metrics.request_done(parsed.route, fault.attempt.replica.url, fault.resp.status,
                                      fault.attempt.decision.arm)
            return self._error_reply(fault, request_id)
        if last_error is not None:
            raise UpstreamError(f"all {len(tried)} replicas tried failed; last: {last_error.message}")
        raise NoHealthyReplica("no healthy replica to route to")

    def _dispatch(self, view: RequestView, policy: Policy, chain: list[int],
                  candidates: list[ReplicaView], *, retry: bool) -> _Attempt:
        """Ask the policy (``NoReplicaAvailable`` when it has none) and count the attempt
        in the chosen replica's in-flight."""
        decision = policy.choose(view, candidates)
        replica = self.replicas.by_id[decision.replica]
        if retry:
            self.metrics.retry(replica.url, decision.arm)
        self.metrics.decision(policy.name, decision.reason, decision.arm)
        policy.dispatched(view, decision)
        self.locator.dispatched(view.request_id, chain, replica.id)
        replica.in_flight += 1
        return _Attempt(view, decision, replica, chain, policy)

    async def _fault(self, resp: UpstreamResponse, attempt: _Attempt) -> _Fault:
        """A 5xx answer: read it, and count it against the replica only when it says the
        replica is at fault (``router.failures``)."""
        body = await self._read_or_none(resp)
        verdict = classify(resp.status, resp.content_type, body)
        if verdict == "replica":
            self._failed(attempt, f"http_{resp.status}", f"answered {resp.status}")
        else:
            self._failed(attempt, f"{verdict}_{resp.status}", f"answered {resp.status}",
                         count=False)
        return _Fault(resp, body, attempt, verdict)

    def _acquit(self, fault: _Fault | None, status: int) -> None:
        """Another replica served the request (``status`` < 400; a 4xx says the request was
        bad after all): an unexplained 5xx before was the replica's."""
        if fault is not None and fault.verdict == "suspect" and status < 400:
            self.replicas.record_failure(fault.attempt.replica,
                                         f"answered {fault.resp.status} where another did not")

    def _error_reply(self, fault: _Fault, request_id: str) -> Response:
        body = shaped(fault.resp.status, fault.resp.content_type, fault.body)
        if body is None:
            return self._buffered(fault.resp, fault.body or b"", fault.attempt, request_id)
        out = Response(body, status_code=fault.resp.status)
        out.raw_headers = [
            *((k, v) for k, v in self._headers(fault.resp, fault.attempt, request_id)
              if k != b"content-type"),
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        return out

    @staticmethod
    async def _read_or_none(resp: UpstreamResponse) -> bytes | None:
        try:
            return await resp.read()
        except UpstreamStreamBroken:
            return None

    def _close(self, attempt: _Attempt) -> None:
        """However an attempt ended: out of its replica's in-flight count and the router's
        in-flight prefixes."""
        attempt.replica.in_flight -= 1
        attempt.open = False
        self.locator.settled(attempt.view.request_id)

    def _failed(self, attempt: _Attempt, kind: str, error: str, *, count: bool = True) -> None:
        """An attempt that served nothing; ``count``: it counts toward ejecting the replica."""
        self._close(attempt)
        if count:
            self.replicas.record_failure(attempt.replica, error)
        self.metrics.upstream_error(attempt.replica.url, kind, attempt.decision.arm)
        attempt.policy.observe(Outcome(attempt.view, attempt.decision, ok=False,
                                    at=self.clock()))

    def _finished(self, attempt: _Attempt, status: int, t0: float, *, ttft: float | None,
                  ok: bool, tail: bytes) -> None:
        now = self.clock()
        self._close(attempt)
        self.replicas.record_success(attempt.replica, from_probe=False)
        _after_reply(self._record, attempt, status, now - t0, ttft, ok, now, tail)

    def _record(self, attempt: _Attempt, status: int, total_s: float, ttft: float | None,
                ok: bool, now: float, tail: bytes) -> None:
        """What a finished reply leaves behind (its metrics, what the policy learns, the
        prefix now held), once the reply is on its way (``_after_reply``). ``tail``: the
        reply's last bytes, where the engine's usage is (``router.usage``)."""
        self.metrics.request_done(attempt.view.endpoint, attempt.replica.url, status,
                                  attempt.decision.arm, duration_s=total_s, ttft_s=ttft,
                                  predicted_ttft_s=attempt.decision.predicted_ttft_s if ok else None)
        usage = engine_usage(tail) if ok else None
        prompt, cached = usage if usage is not None else (None, None)
        attempt.policy.observe(Outcome(attempt.view, attempt.decision, ok=ok, ttft_s=ttft,
                                       total_s=total_s, at=now, prompt_tokens=prompt,
                                       cached_tokens=cached))
        if ok:
            self.locator.served(attempt.view.session, attempt.chain, attempt.replica.id)

    def _abandoned(self, attempt: _Attempt) -> None:
        """The client left while ``attempt`` was in flight (its upstream request was
        cancelled): the replica's count drops now, and the policy sees a failed outcome."""
        self._close(attempt)
        self.metrics.request_done(attempt.view.endpoint, attempt.replica.url, CLIENT_CLOSED,
                                  attempt.decision.arm)
        attempt.policy.observe(Outcome(attempt.view, attempt.decision, ok=False,
                                       at=self.clock()))

    def _headers(self, resp: UpstreamResponse, attempt: _Attempt,
                 request_id: str) -> list[tuple[bytes, bytes]]:
        out = [(k, v) for k, v in end_to_end_raw(resp.raw_headers) if k != b"x-request-id"]
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
                t0: float, scope: Scope) -> Response:
        ttft: float | None = None

        def first_byte() -> None:
            nonlocal ttft
            now = self.clock()
            ttft = now - t0
            # The prefill is over: queue-aware policies free the replica now, not when
            # the (long) decode ends.
            _after_reply(attempt.policy.observe, Outcome(
                attempt.view, attempt.decision, ok=True, ttft_s=ttft, phase="first_token", at=now))
            self.locator.first_token(attempt.view.request_id, attempt.replica.id)

        def broken(exc: UpstreamStreamBroken) -> None:
            self.metrics.upstream_error(attempt.replica.url, "mid_stream", attempt.decision.arm)

        def finish(ended: bool, ok: bool, tail: bytes) -> None:
            if not ended:  # the client left mid-stream: the upstream is closed now
                self.metrics.client_disconnect("mid_stream")
                mark_gone(scope)
            self._finished(attempt, resp.status, t0, ttft=ttft,
                           ok=ended and ok and resp.status < 400, tail=tail)

        return Relay(resp, self._headers(resp, attempt, request_id), first_byte=first_byte,
                     broken=broken, finish=finish)
