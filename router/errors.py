"""The router's one exception tree, and how each branch reaches the client.

    LmrouteError                       status, OpenAI error type and code
    ├── BadRequest            400      malformed JSON, missing or mistyped fields
    ├── Unauthorized          401      no or wrong key (a tenant's, or the admin key)
    ├── PinForbidden          403      a pin header (``router.pin``) without the admin key
    ├── NotFound              404      unknown route
    │   └── ModelNotFound              a model no replica serves (vLLM's own 404 shape)
    ├── PayloadTooLarge       413      body over ``max_body_bytes`` (decompressed)
    ├── UnsupportedEncoding   415      a Content-Encoding other than gzip/deflate/identity
    ├── RateLimited           429      a tenant over its concurrency or rate (Retry-After)
    ├── UpstreamError         502      every replica tried failed before the first byte
    │   ├── UpstreamConnectError       connect refused / reset / timed out (retryable)
    │   └── UpstreamStreamBroken       a replica's body broke while being read: retried
    │                                  on another replica while still buffered (nothing
    │                                  sent yet); once streamed bytes reached the client,
    │                                  the stream ends with ``sse_error_event`` instead
    └── NoHealthyReplica      503      nothing to route to

Third-party exceptions (aiohttp, OS errors) are mapped to this tree at one boundary,
``router.upstream``. The request path and the admin API only raise; an ``LmrouteError``
becomes a response in one place, the exception handler ``router.routes`` registers on the
app, which renders ``error_body``: ``{"error": {"message", "type", "param", "code"}}``, the
shape the OpenAI SDKs parse (plus ``x-request-id`` when the error carries one).

This module stays pure Python in the compiled build (setup.py): mypyc's exception classes
lose the class-level defaults (``status``, ``type``, ``code``) the subclasses override.
"""

from __future__ import annotations

import orjson


class LmrouteError(Exception):
    status: int = 500
    type: str = "internal_error"
    code: str | None = None

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None,
                 status: int | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        self.request_id: str | None = None  # set by the proxy: echoed as x-request-id
        if code is not None:
            self.code = code
        if status is not None:
            self.status = status

    def body(self) -> bytes:
        return error_body(self.message, self.type, self.param, self.code)


class BadRequest(LmrouteError):
    status = 400
    type = "invalid_request_error"
    code = "invalid_request"


class Unauthorized(LmrouteError):
    status = 401
    type = "authentication_error"
    code = "invalid_api_key"


class PinForbidden(LmrouteError):
    status = 403
    type = "permission_error"
    code = "pin_forbidden"


class NotFound(LmrouteError):
    status = 404
    type = "invalid_request_error"
    code = "not_found"


class ModelNotFound(NotFound):
    """vLLM's answer for an unknown model: type ``NotFoundError``, the status as ``code``."""

    type = "NotFoundError"

    def __init__(self, model: str):
        super().__init__(f"The model `{model}` does not exist.", param="model")

    def body(self) -> bytes:
        return orjson.dumps({"error": {"message": self.message, "type": self.type,
                                       "param": self.param, "code": self.status}})


class PayloadTooLarge(LmrouteError):
    status = 413
    type = "invalid_request_error"
    code = "request_too_large"


class UnsupportedEncoding(LmrouteError):
    status = 415
    type = "invalid_request_error"
    code = "unsupported_content_encoding"


class RateLimited(LmrouteError):
    """429; ``retry_after_s`` becomes the ``Retry-After`` header (whole seconds, >= 1)."""

    status = 429
    type = "rate_limit_error"
    code = "rate_limited"

    def __init__(self, message: str, *, retry_after_s: float, code: str | None = None):
        super().__init__(message, code=code)
        self.retry_after_s = retry_after_s


class UpstreamError(LmrouteError):
    status = 502
    type = "upstream_error"
    code = "bad_gateway"


class UpstreamConnectError(UpstreamError):
    code = "upstream_unreachable"


class UpstreamStreamBroken(UpstreamError):
    code = "upstream_stream_broken"


class NoHealthyReplica(LmrouteError):
    status = 503
    type = "service_unavailable"
    code = "no_healthy_replica"


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> bytes:
    """Serialize one OpenAI-shaped error object."""
    return orjson.dumps({"error": {"message": message, "type": type_, "param": param, "code": code}})


def sse_error_event(message: str, code: str = "upstream_stream_broken") -> bytes:
    """The SSE event that ends a stream whose replica failed after bytes reached the client.

    The OpenAI SDKs raise on a streamed chunk carrying ``error``, so the client learns the
    reply is incomplete instead of silently taking a truncated answer.
    """
    return b"data: " + error_body(message, "upstream_error", None, code) + b"\n\n"
