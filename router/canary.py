"""The live canary: replay sampled requests from the shared pool and cold, and stop
trusting a pool that answers differently.

Sampling. Every ``ceil(1 / rate)``-th successful chat/completions reply the router
routed (not pinned ones) is offered (deterministic: a rate of 0.01 samples the 100th,
200th, ...), while the budget allows: at most ``budget`` canary requests in any 60 s
window, each canary costing two. Canaries run as background tasks; the client's reply
never waits on one, and they go straight to the replicas (``Upstream``), so they are
never counted as client traffic (no request metrics, no policy outcome, no index write).

A canary (``check``): the request's prefix chain is looked up in the index, the pool's
tier included even while it is distrusted. With a pool prefix and a healthy replica whose
GPU holds less of it than the pool does, two greedy replays of the body (``max_tokens``
K, temperature 0, seed 0, logprobs with two alternatives, not streamed) are sent:

    pooled  to that replica (the least loaded such), the body's own ``cache_salt``: it
            loads the prefix from the pool
    cold    to the least loaded healthy replica, a fresh random ``cache_salt``: computed

and compared as ``lmroute validate`` compares (``router.validate.compare``: same tokens,
logprobs within ``tol`` nats, a flip only at a near tie). Without a pool path the canary
is ``no_pool_path`` and costs nothing but the lookup.

Suspect. A diverging canary marks the pool suspect at once: ``lmroute_pool_suspect`` 1,
a warning in the log naming the replica and the first differing position, and the
locator's ``pool_trusted`` false, so every policy sees no pool tier (a residency with
``pool = 0``: sessions stay put, as with ``--pool-bytes 0``). It clears after
``clean_to_clear`` clean canaries in a row, or ``POST /admin/canary/clear``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import uuid
from collections import deque
from collections.abc import Callable
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from router.errors import LmrouteError
from router.locator import Locator
from router.metrics import RouterMetrics
from router.openai_api import Endpoint, parse_request
from router.replicas import Replica, ReplicaSet
from router.upstream import Upstream
from router.validate.compare import BadReply, Comparison, compare, parse_reply

log = logging.getLogger("lmroute.canary")
PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
_DROPPED = ("stream", "stream_options", "max_completion_tokens", "n", "best_of", "top_p",
            "top_k", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty")


def probe_body(endpoint: Endpoint, body: dict[str, Any], max_tokens: int) -> dict[str, Any]:
    """A client's body as a short greedy replay with logprobs."""
    out = {k: v for k, v in body.items() if k not in _DROPPED}
    out.update(max_tokens=max_tokens, temperature=0, seed=0, ignore_eos=True,
               return_tokens_as_token_ids=True)
    if endpoint == "chat":
        out.update(logprobs=True, top_logprobs=2)
    else:
        out["logprobs"] = 2
    return out


def _load(r: Replica) -> float:
    return r.in_flight + r.running + r.waiting


class Canary:
    """Samples, replays, compares; holds the pool's suspect state."""

    def __init__(self, *, rate: float, budget: int, clean_to_clear: int, tol: float,
                 max_tokens: int, replicas: ReplicaSet, upstream: Upstream, locator: Locator,
                 metrics: RouterMetrics, clock: Callable[[], float]) -> None:
        self.every = math.ceil(1 / rate) if rate > 0 else 0
        self.budget, self.clean_to_clear = budget, clean_to_clear
        self.tol, self.max_tokens = tol, max_tokens
        self.replicas, self.upstream, self.locator = replicas, upstream, locator
        self.metrics, self.clock = metrics, clock
        self.suspect = False
        self.why = ""
        self.clean = 0  # clean canaries in a row
        self.counts: dict[str, int] = {}
        self._seen = 0
        self._spent: deque[float] = deque()  # when each canary request was sent
        self._tasks: set[asyncio.Task[None]] = set()

    def offer(self, endpoint: Endpoint, raw: bytes, auth: str | None) -> None:
        """A routed reply succeeded; every ``every``-th becomes a canary, budget allowing."""
        if not self.every:
            return
        self._seen += 1
        if self._seen % self.every:
            return
        now = self.clock()
        while self._spent and self._spent[0] <= now - 60.0:
            self._spent.popleft()
        if len(self._spent) + 2 > self.budget:
            self._count("over_budget")
            return
        self._spent.extend((now, now))
        task = asyncio.get_running_loop().create_task(self._run(endpoint, raw, auth))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, endpoint: Endpoint, raw: bytes, auth: str | None) -> None:
        try:
            result = await self.check(endpoint, raw, auth)
        except (LmrouteError, BadReply, ValueError) as exc:
            log.info("canary not completed: %s", exc)
            result = "error"
        self._count(result)

    def _count(self, result: str) -> None:
        self.counts[result] = self.counts.get(result, 0) + 1
        self.metrics.canary(result)

    async def check(self, endpoint: Endpoint, raw: bytes, auth: str | None) -> str:
        """One canary (see the module docstring); its result."""
        parsed = parse_request(endpoint, raw, None)
        chain = self.locator.chain(parsed)
        found = await self.locator.residency(chain, trusted=True)
        healthy = [r for r in self.replicas.replicas if r.healthy and not r.draining]
        loaders = [r for r in healthy if found.gpu_blocks(r.id) < found.pool]
        if not chain or not loaders:
            return "no_pool_path"
        loader, cold = min(loaders, key=_load), min(healthy, key=_load)
        body = probe_body(endpoint, parsed.body, self.max_tokens)
        pooled = await self._ask(loader, endpoint, body, auth)
        fresh = await self._ask(cold, endpoint, {**body, "cache_salt": uuid.uuid4().hex}, auth)
        result = compare(parse_reply(fresh), parse_reply(pooled), self.tol)
        if result.ok:
            self._clean_one()
            return "clean"
        self._diverged(loader, result)
        return "diverged"

    async def _ask(self, replica: Replica, endpoint: Endpoint, body: dict[str, Any],
                   auth: str | None) -> Any:
        headers = [(b"content-type", b"application/json"),
                   (b"x-request-id", b"canary-" + uuid.uuid4().hex.encode())]
        if auth:
            headers.append((b"authorization", auth.encode("latin-1")))
        resp = await self.upstream.send("POST", replica.url + PATHS[endpoint], headers,
                                        orjson.dumps(body))
        data = await resp.read()
        if resp.status != 200:
            raise ValueError(f"canary replay on {replica.url} answered {resp.status}")
        return orjson.loads(data)

    def _diverged(self, replica: Replica, result: Comparison) -> None:
        self.clean = 0
        self.why = (f"a canary loaded from the pool on {replica.url} diverged from a cold "
                    f"replay at output position {result.first_diff} (token "
                    f"{result.first_token_diff}, logprob {result.first_logprob_diff}, "
                    f"max |dlogprob| {result.max_dlogprob:.3g} > {self.tol})")
        if not self.suspect:
            log.warning("pool suspect: %s; the pool tier is treated as absent until %d clean "
                        "canaries or POST /admin/canary/clear", self.why, self.clean_to_clear)
        self._set(True)

    def _clean_one(self) -> None:
        self.clean += 1
        if self.suspect and self.clean >= self.clean_to_clear:
            log.warning("pool trusted again after %d clean canaries", self.clean)
            self._set(False)

    def clear(self) -> None:
        """The admin's call: trust the pool again now."""
        if self.suspect:
            log.warning("pool trusted again by the admin API")
        self.clean = 0
        self._set(False)

    def _set(self, suspect: bool) -> None:
        self.suspect = suspect
        self.locator.pool_trusted = not suspect
        self.metrics.pool_suspect(suspect)

    def state(self) -> dict[str, Any]:
        return {"suspect": self.suspect, "why": self.why, "clean_in_a_row": self.clean,
                "clean_to_clear": self.clean_to_clear, "every": self.every,
                "budget_per_minute": self.budget, "results": dict(self.counts)}

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


def canary_routes(canary: Canary) -> list[Route]:
    """``GET /admin/canary`` (its state) and ``POST /admin/canary/clear`` (trust the pool
    again now); behind the admin key (``router.gate``)."""

    async def state(request: Request) -> Response:
        return Response(orjson.dumps(canary.state()), media_type="application/json")

    async def clear(request: Request) -> Response:
        canary.clear()
        return await state(request)

    return [Route("/admin/canary", state, methods=["GET"]),
            Route("/admin/canary/clear", clear, methods=["POST"])]
