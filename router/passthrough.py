"""The rest of vLLM's surface, passed through byte for byte with the proxy's failover.

Every route below goes through ``Proxy.handle`` with a ``prepare`` of its own: the same
choice, failover before the first byte (connect errors, 5xx), headers, metrics and
streaming as chat/completions; the client's bytes are forwarded unchanged and the
replica's reply reaches the client unchanged.

    prompt    /v1/responses, /v1/messages      prefix-aware: the body is hashed as a chat
                                               (``router.shapes``), then the policy decides
    balanced  /v1/embeddings, /tokenize, /detokenize, /v1/score, /score, /v1/rerank,
              /rerank, /v2/rerank, /classify, /pooling, /v1/messages/count_tokens,
              GET /version                     no prefix: load-balanced by the policy
    upload    /v1/audio/transcriptions, /v1/audio/translations
                                               multipart, streamed through (``router.upload``)
    pinned    GET|DELETE /v1/responses/{id}, POST /v1/responses/{id}/cancel, and a
              /v1/responses body with ``previous_response_id``: the replica that created
              the response (``router.response_ids``); an id known nowhere is looked for
              on every replica, then 404
    fan-out   /v1/load_lora_adapter, /v1/unload_lora_adapter, /sleep, /wake_up,
              /reset_prefix_cache, GET /is_sleeping: every replica (``router.fanout``),
              behind the admin key; a LoRA change re-reads the replicas' models

Each request is first checked against the model map (``router.models``): only replicas
serving its ``model`` are candidates, and an unknown model is vLLM's 404. A response id is
learnt from the reply (the JSON body, or the first SSE event of a stream).
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from router.errors import BadRequest, NotFound, PayloadTooLarge, UpstreamConnectError
from router.fanout import FanOut
from router.gate import Gate
from router.ids import new_id
from router.jsonbody import load_json
from router.membership import Membership
from router.models import ModelMap
from router.openai_api import ParsedRequest, lax_bool, parse_request
from router.proxy import Prepare, Proxy, Target
from router.relay import Relay
from router.replicas import ReplicaSet
from router.replicas_admin import replica_admin_routes
from router.response_ids import ResponseIds
from router.settings import Settings
from router.shapes import messages_as_chat, responses_as_chat
from router.upload import ReplayBody, check_declared, guarded
from router.upstream import Upstream

BALANCED = ("/v1/embeddings", "/tokenize", "/detokenize", "/v1/score", "/score", "/v1/rerank",
            "/rerank", "/v2/rerank", "/classify", "/pooling", "/v1/messages/count_tokens")
UPLOADS = ("/v1/audio/transcriptions", "/v1/audio/translations")
FAN_OUT_POST = ("/v1/load_lora_adapter", "/v1/unload_lora_adapter", "/sleep", "/wake_up",
                "/reset_prefix_cache")
_LORA = ("/v1/load_lora_adapter", "/v1/unload_lora_adapter")
_RESPONSE_ID = re.compile(rb'"id"\s*:\s*"(resp_[^"]+)"')
Handler = Callable[[Request], Awaitable[Response]]


def _target(request: Request, body: bytes | None) -> Target:
    query = request.url.query
    return Target(request.method, request.url.path + (f"?{query}" if query else ""), body)


def _label(path: str) -> str:
    return path.strip("/").removeprefix("v1/").replace("/", "_") or "root"


def balanced(request: Request, body: dict[str, Any], size: int) -> ParsedRequest:
    """What routing needs from a body with no prompt prefix: its model (and ``stream``)."""
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise BadRequest("'model' must be a string", param="model")
    return ParsedRequest(endpoint="completions", body=body, model=model or "",
                         stream=bool(lax_bool(body.get("stream"))),
                         session="n:" + new_id(), prompt_chars=size, max_tokens=None,
                         label=_label(request.url.path), hashed=False)


class Surface:
    """The pass-through, pinned and fan-out routes over the router's parts."""

    def __init__(self, *, proxy: Proxy, replicas: ReplicaSet, upstream: Upstream, gate: Gate,
                 models: ModelMap, ids: ResponseIds, fanout: FanOut, membership: Membership,
                 lookup_timeout_s: float) -> None:
        self.proxy, self.replicas, self.upstream, self.gate = proxy, replicas, upstream, gate
        self.models, self.ids, self.fanout = models, ids, fanout
        self.membership = membership
        self.lookup_timeout_s = lookup_timeout_s

    @classmethod
    def build(cls, settings: Settings, *, proxy: Proxy, replicas: ReplicaSet,
              upstream: Upstream, gate: Gate, dns: Sequence[str] = ()) -> Surface:
        """The surface for ``settings`` (its ``backends`` the URLs; ``dns`` the ``dns+``
        entries); the proxy's candidates become the model map's."""
        models = ModelMap(replicas, upstream, interval_s=settings.models_refresh_s,
                          timeout_s=settings.health_timeout_s)
        proxy.candidates = models.candidates
        redis_url = settings.index if settings.index.startswith(("redis", "unix")) else None
        ids = ResponseIds(redis_url, ttl_s=settings.responses_ttl_s)
        fanout = FanOut(replicas, upstream, timeout_s=settings.fanout_timeout_s,
                        name_of=gate.name_of, drop_auth=bool(settings.admin_key))
        membership = Membership(
            replicas, upstream, gate=gate, locator=proxy.locator, models=models, ids=ids,
            probe_timeout_s=settings.health_timeout_s, backends_file=settings.backends_file,
            backends_poll_s=settings.backends_poll_s, dns=dns,
            dns_interval_s=settings.dns_interval_s, dns_hosts_file=settings.dns_hosts_file)
        return cls(proxy=proxy, replicas=replicas, upstream=upstream, gate=gate, models=models,
                   ids=ids, fanout=fanout, membership=membership,
                   lookup_timeout_s=settings.health_timeout_s)

    def start(self) -> None:
        self.models.start()
        self.membership.start()

    async def stop(self) -> None:
        await self.membership.stop()
        await self.models.stop()
        await self.ids.close()

    # -- prepare: request -> (what routing needs, what to send) ---------------------------
    async def _json(self, request: Request) -> tuple[bytes, dict[str, Any]]:
        raw = await request.body()  # read (and limited, decoded) by the gate
        body = load_json(raw) if raw else {}
        if not isinstance(body, dict):
            raise BadRequest("request body must be a JSON object")
        return raw, body

    async def prepare_balanced(self, request: Request) -> tuple[ParsedRequest, Target]:
        raw, body = await self._json(request) if request.method == "POST" else (b"", {})
        return balanced(request, body, len(raw)), _target(request, raw or None)

    async def prepare_responses(self, request: Request) -> tuple[ParsedRequest, Target]:
        raw, body = await self._json(request)
        parsed = parse_request("chat", orjson.dumps(responses_as_chat(body)),
                               request.headers.get("x-session-id"))
        parsed = replace(parsed, label="responses")
        previous = body.get("previous_response_id")
        if isinstance(previous, str):  # the conversation lives on the replica holding it
            parsed = replace(parsed, replica=await self._holder(previous))
        return parsed, _target(request, raw)

    async def prepare_messages(self, request: Request) -> tuple[ParsedRequest, Target]:
        raw, body = await self._json(request)
        parsed = parse_request("chat", orjson.dumps(messages_as_chat(body)),
                               request.headers.get("x-session-id"))
        return replace(parsed, label="messages"), _target(request, raw)

    async def prepare_by_id(self, request: Request) -> tuple[ParsedRequest, Target]:
        parsed = balanced(request, {}, 0)
        holder = await self._holder(str(request.path_params["response_id"]))
        raw = await request.body() if request.method == "POST" else b""
        return replace(parsed, replica=holder, label="responses_by_id"), \
            _target(request, raw or None)

    async def _holder(self, response_id: str) -> str:
        """The replica holding ``response_id``: remembered, else asked of every replica."""
        known = await self.ids.get(response_id)
        if known is not None and known in self.replicas.by_id:
            return known
        for replica in list(self.replicas.replicas):
            try:
                status, _ = await self.upstream.get(
                    f"{replica.url}/v1/responses/{response_id}", self.lookup_timeout_s)
            except UpstreamConnectError:  # an unreachable replica does not hold it now
                continue
            if status == 200:
                await self.ids.put(response_id, replica.id)
                return replica.id
        raise NotFound(f"Response with id '{response_id}' not found.", param="response_id")

    # -- replies -------------------------------------------------------------------------
    async def _learn_ids(self, response: Response) -> Response:
        """Remember which replica created the response id in ``response`` (a created or
        cancelled response)."""
        replica = dict(response.raw_headers).get(b"x-lmroute-replica", b"").decode("latin-1")
        if not replica or response.status_code >= 400:
            return response
        if isinstance(response, Relay):  # a stream (router.relay)
            response.wrap(lambda chunks: self._sniff(chunks, replica))
            return response
        if isinstance(response, StreamingResponse):
            response.body_iterator = self._sniff(response.body_iterator, replica)
            return response
        found = _RESPONSE_ID.search(bytes(response.body)[:4096])
        if found:
            await self.ids.put(found.group(1).decode(), replica)
        return response

    async def _sniff(self, chunks: AsyncIterable[Any], replica: str) -> AsyncIterator[Any]:
        head, looking = b"", True
        async for chunk in chunks:
            if looking:  # the id is in the first event (response.created)
                head += chunk if isinstance(chunk, bytes) else str(chunk).encode()
                found = _RESPONSE_ID.search(head)
                if found:
                    await self.ids.put(found.group(1).decode(), replica)
                looking = not found and len(head) < 65_536
            yield chunk

    # -- handlers ------------------------------------------------------------------------
    def _proxied(self, prepare: Prepare, *, learn: bool = False) -> Handler:
        async def handler(request: Request) -> Response:
            response = await self.proxy.handle("completions", request, prepare)
            return await self._learn_ids(response) if learn else response

        return handler

    async def upload(self, request: Request) -> Response:
        check_declared(request, self.proxy.max_body_bytes)
        body = ReplayBody(request, self.proxy.max_body_bytes)
        model = await body.sniff_model()
        if body.cut:
            raise PayloadTooLarge(body.cut) if "limit" in body.cut else BadRequest(body.cut)

        async def prepare(req: Request) -> tuple[ParsedRequest, Target]:
            parsed = balanced(request, {"model": model} if model else {}, 0)
            return parsed, Target("POST", request.url.path, body.chunks)

        return await self.proxy.handle("completions", guarded(request, body), prepare)

    async def delete_response(self, request: Request) -> Response:
        response = await self.proxy.handle("completions", request, self.prepare_by_id)
        if response.status_code < 300:
            await self.ids.delete(str(request.path_params["response_id"]))
        return response

    async def fan_out(self, request: Request) -> Response:
        response, _ = await self.fanout.send(request)
        if request.url.path in _LORA:  # a new adapter is a new model name to route by
            await self.models.refresh_now()
        return response

    def routes(self) -> list[Route]:
        wrap = self.gate.wrap

        def tenant(handler: Handler, *, salt: bool = False, stream: bool = False) -> Handler:
            return wrap("tenant", handler, proxied=True, salt=salt, stream_body=stream)

        by_id = "/v1/responses/{response_id}"
        return [
            Route("/v1/responses", tenant(self._proxied(self.prepare_responses, learn=True),
                                          salt=True), methods=["POST"]),
            Route("/v1/messages", tenant(self._proxied(self.prepare_messages)),
                  methods=["POST"]),
            *(Route(p, tenant(self._proxied(self.prepare_balanced)), methods=["POST"])
              for p in BALANCED),
            Route("/version", tenant(self._proxied(self.prepare_balanced)), methods=["GET"]),
            *(Route(p, tenant(self.upload, stream=True), methods=["POST"]) for p in UPLOADS),
            Route(by_id, tenant(self._proxied(self.prepare_by_id)), methods=["GET"]),
            Route(by_id, tenant(self.delete_response), methods=["DELETE"]),
            Route(by_id + "/cancel", tenant(self._proxied(self.prepare_by_id, learn=True)),
                  methods=["POST"]),
            *(Route(p, wrap("internal", self.fan_out), methods=["POST"]) for p in FAN_OUT_POST),
            Route("/is_sleeping", wrap("internal", self.fan_out), methods=["GET"]),
            *(Route(r.path, wrap("admin", r.endpoint), methods=r.methods)
              for r in replica_admin_routes(self.membership)),
        ]
