"""The router's front door: who may call which route, what a body may be, what leaves.

Every route is wrapped by ``Gate.wrap(access, handler)``; ``access`` is one of

    public     /health, /ready, /metrics, /openapi.json: anyone
    tenant     /v1/...: with ``--api-keys``, a tenant's key (``Authorization: Bearer``,
               401 otherwise), admitted under its limits (429, ``router.tenants``);
               without, anyone
    internal   /index/lookup, /replicas, /policy: the admin key when one is set (401
               otherwise); with tenants but no admin key, 404 (nobody); with neither,
               anyone (no caller is authenticated, so there is nothing to keep apart)
    admin      /admin/...: the admin key; without one, 404 (as if absent)

The internal routes sit behind the admin key on the one listener rather than on a second
port: one process, one socket to drain, and the ``Authorization: Bearer`` convention the
admin API and ``lmroute ab`` already use; an operator who wants them off the network edge
can also drop those four path prefixes at the load balancer.

Bodies. A POST's body is read once here, under ``max_body_bytes`` counted after
``Content-Encoding`` is undone (``router.bodies``), whatever the route, and handed on
decoded (``Content-Encoding`` dropped, ``Content-Length`` set): the handler reads it as
usual. For a tenant's chat or completions body the tenant's salt is written into
``cache_salt`` (combined with the client's own, ``router.tenants.combine``), and the
tenant's key is not forwarded to the replicas.

What leaves. The ``x-lmroute-replica`` header names a replica by its position in
``--backend`` (``r0``, ``r1``, ...) unless ``--expose-replica-header`` keeps the URL.
``X-LMRoute-Pin-Replica`` on a routed request needs the admin key (403 otherwise) and
then routes it as the operator's, under no tenant (``router.pin``).
A tenant's slot is given back when the response has been sent (a stream's last byte, or
the client gone), whatever happened.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, Mapping
from typing import Literal

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from router import compiled
from router.bodies import read_decoded
from router.errors import BadRequest, NotFound, PinForbidden, Unauthorized
from router.headers import has_header, header
from router.jsonbody import load_json
from router.pin import PIN_HEADER
from router.tenants import Tenant, Tenants, combine

Access = Literal["public", "tenant", "internal", "admin"]
Handler = Callable[[Request], Awaitable[Response]]
_REPLICA_HEADER = b"x-lmroute-replica"
_DROPPED = {b"content-length", b"content-encoding"}
_PIN_RAW = PIN_HEADER.encode()


def bearer(request: Request) -> str | None:
    scheme, _, token = (header(request, b"authorization") or "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def salted(raw: bytes, tenant: Tenant) -> bytes:
    """A chat/completions body with the tenant's (combined) ``cache_salt``; a body that is
    not a JSON object is returned as is, for the parser to refuse."""
    body = load_json(raw)
    if not isinstance(body, dict):
        return raw
    client = body.get("cache_salt")
    if client is not None and (not isinstance(client, str) or not client):
        raise BadRequest("'cache_salt' must be a non-empty string", param="cache_salt")
    body["cache_salt"] = combine(tenant.salt, client)
    return orjson.dumps(body)


def _replayed(request: Request, body: bytes | None, drop: set[bytes]) -> Request:
    """``request`` with ``body`` as its (decoded) body (``None``: its own, unread) and
    without the ``drop`` headers (lower case); later receives (the client's disconnect)
    still come from the connection."""
    dropped = set(drop)
    if body is not None:
        dropped |= _DROPPED
    headers = [(k, v) for k, v in request.scope["headers"] if k.lower() not in dropped]
    if body is None:
        return Request({**request.scope, "headers": headers}, request.receive)
    headers.append((b"content-length", str(len(body)).encode()))
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await request.receive()

    replayed = Request({**request.scope, "headers": headers}, receive)
    replayed._body = body  # Starlette's own cache of a read body: body() and stream() use it
    return replayed


class _Egress(Response):
    """Sends ``inner`` with the replica header renamed, then runs ``done``.

    The rename is done on ``inner.raw_headers``, what every Starlette response sends as
    its start message, rather than by wrapping ``send``: a streamed reply would otherwise
    pay for the wrapper on every event."""

    def __init__(self, inner: Response, done: Callable[[], None] | None,
                 names: Mapping[bytes, bytes] | None):
        # Response.__init__ would render an empty body and headers nobody sends.
        self.status_code, self.background = inner.status_code, None
        self.inner, self.done, self.names = inner, done, names

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        names, inner = self.names, self.inner
        try:
            if names is not None:
                inner.raw_headers = [(k, names.get(v, b"?")) if k == _REPLICA_HEADER else (k, v)
                                     for k, v in inner.raw_headers]
            await inner(scope, receive, send)
        finally:
            if self.done is not None:
                self.done()


class Gate:
    """Authentication, admission, body limits and egress filtering for every route."""

    def __init__(self, *, tenants: Tenants | None, admin_key: str, max_body_bytes: int,
                 replica_names: Mapping[str, str] | None):
        self.tenants = tenants
        self.admin_key = admin_key
        self.max_body_bytes = max_body_bytes
        # URL -> name, as bytes for the header; None: URLs are shown (--expose-replica-header)
        self.names: dict[bytes, bytes] | None = None if replica_names is None else {
            url.encode("latin-1"): name.encode() for url, name in replica_names.items()}

    def name_of(self, url: str) -> str:
        """How the replica header names ``url``; a replica that joined later gets the next
        ``rN`` (``router.membership``)."""
        if self.names is None:
            return url
        key = url.encode("latin-1")
        if key not in self.names:
            self.names[key] = f"r{len(self.names)}".encode()
        return self.names[key].decode()

    def _pin(self, request: Request) -> None:
        """Allow ``X-LMRoute-Pin-Replica`` (``router.pin``) to the admin key only."""
        token = bearer(request) or ""
        if not self.admin_key or not hmac.compare_digest(token.encode(), self.admin_key.encode()):
            raise PinForbidden(f"{PIN_HEADER} needs the admin key (Authorization: Bearer KEY)"
                               + ("" if self.admin_key else "; this router has none"))
        request.scope.setdefault("state", {})["pin"] = header(request, _PIN_RAW)

    def _admin(self, request: Request, access: Access) -> None:
        if not self.admin_key:
            if access == "admin" or self.tenants is not None:
                raise NotFound(f"no route {request.method} {request.url.path}")
            return
        token = bearer(request) or ""
        if not hmac.compare_digest(token.encode(), self.admin_key.encode()):
            raise Unauthorized("missing or wrong admin key (Authorization: Bearer KEY)")

    def _tenant(self, request: Request) -> Tenant | None:
        if self.tenants is None:
            return None
        key = bearer(request)
        tenant = self.tenants.lookup(key) if key else None
        if tenant is None:
            raise Unauthorized("missing or unknown API key (Authorization: Bearer KEY)"
                               if key is None else "incorrect API key provided")
        return tenant

    def wrap(self, access: Access, handler: Handler, *, proxied: bool = False,
             salt: bool = True, stream_body: bool = False) -> Handler:
        """``handler`` behind this gate; ``proxied``: a routed request (its replica header
        renamed; its body salted for a tenant unless ``salt`` is false); ``stream_body``:
        the handler reads the body itself, as it comes (an upload, ``router.upload``)."""

        async def endpoint(request: Request) -> Response:
            tenant: Tenant | None = None
            pinned = proxied and has_header(request, _PIN_RAW)
            if pinned:
                self._pin(request)
            elif access in ("internal", "admin"):
                self._admin(request, access)
            elif access == "tenant":
                tenant = self._tenant(request)
                if tenant is not None:  # for the access log: the name, never the key
                    request.scope.setdefault("state", {})["tenant"] = tenant.name
            body: bytes | None = None
            if request.method in ("POST", "DELETE") and not stream_body:
                body = await read_decoded(request, self.max_body_bytes)
                if tenant is not None and proxied and salt:
                    body = salted(body, tenant)
            # A body the gate left as sent (no coding undone, no salt) is the request's own,
            # in Starlette's cache already: the request goes on as it came.
            if tenant is not None or pinned or (
                    body is not None and body is not getattr(request, "_body", None)):
                drop = {b"authorization"} if tenant is not None or pinned else set()
                request = _replayed(request, body, drop | ({PIN_HEADER.encode()} if pinned else set()))
            if access == "public":
                return await handler(request)
            release = (self.tenants.admit(tenant)
                       if tenant is not None and self.tenants is not None else None)
            try:
                response = await handler(request)
            except BaseException:
                if release is not None:
                    release()
                raise
            return _Egress(response, release, self.names if proxied else None)

        return compiled.endpoint(endpoint)
