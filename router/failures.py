"""Whose fault is a replica's 5xx: the replica's, or the request's.

Outlier detection in the style of Envoy's: only failures that say something about the
replica count toward ejecting it; a failure that follows the request (a "poison" body
that makes every engine answer 500) must not take the fleet out.

``classify(status, content_type, body)`` for a reply with status >= 500:

    replica   502/503/504 without a JSON error body (a proxy or the server in front of a
              dead engine answered), or any JSON error whose message says the engine is
              dead (vLLM's ``EngineDeadError``, "EngineCore encountered an issue");
              also (not here: in the proxy) connect errors, timeouts, broken bodies and
              failed health probes
    request   a JSON error body from the engine (vLLM answers errors it caught, e.g. a
              body that crashed the model's input processing, as OpenAI-shaped JSON):
              the engine is alive and said why
    suspect   anything else, e.g. a plain-text ``500 Internal Server Error`` (an
              uncaught exception): unknown until another replica answers the same request

The proxy (``router.proxy``) retries a ``request`` or ``suspect`` failure at most once on
another replica, never counting it toward ejection; when the other replica fails the
request too, it was the request's fault and the client gets the error; when the other
replica serves it, a ``suspect`` failure is counted against the first replica.

``shaped(status, content_type, body)`` is the error body the client gets: the engine's
own when it is already OpenAI-shaped (``{"error": {...}}``), vLLM's older flat shape
(``{"object": "error", "message", ...}``) nested under ``error``, anything else (plain
text, HTML) quoted into an OpenAI-shaped message of at most ``MAX_QUOTED`` characters.
"""

from __future__ import annotations

from typing import Any, Literal

import orjson

from router.errors import error_body

Verdict = Literal["replica", "request", "suspect"]
MAX_QUOTED = 512
_GATEWAY = frozenset({502, 503, 504})
_ENGINE_DEAD = ("enginedead", "engine is dead", "enginecore encountered", "engine loop is not")


def error_object(content_type: str, body: bytes | None) -> dict[str, Any] | None:
    """The JSON error object of a reply (OpenAI's nested or vLLM's flat shape), else None."""
    if not body or "json" not in content_type:
        return None
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(data, dict):
        return None
    nested = data.get("error")
    if isinstance(nested, dict):
        return nested
    if data.get("object") == "error" and "message" in data:
        return data
    return None


def classify(status: int, content_type: str, body: bytes | None) -> Verdict:
    """Whose fault a 5xx reply is (``body`` None: it broke while being read: the replica)."""
    if body is None:
        return "replica"
    err = error_object(content_type, body)
    if err is None:
        return "replica" if status in _GATEWAY else "suspect"
    message = str(err.get("message", "")).lower() + " " + str(err.get("type", "")).lower()
    if any(sign in message for sign in _ENGINE_DEAD):
        return "replica"
    return "request"


def shaped(status: int, content_type: str, body: bytes | None) -> bytes | None:
    """The OpenAI-shaped body for an upstream error reply; None when ``body`` already is."""
    err = error_object(content_type, body)
    if err is not None and body is not None and isinstance(orjson.loads(body).get("error"), dict):
        return None
    if err is not None:
        code = err.get("code")
        return error_body(str(err.get("message", "")), str(err.get("type", "upstream_error")),
                          err.get("param") if isinstance(err.get("param"), str) else None,
                          None if code is None else str(code))
    text = (body or b"").decode("utf-8", "replace").strip()[:MAX_QUOTED]
    message = f"the replica answered {status}" + (f": {text}" if text else "")
    return error_body(message, "upstream_error", None, f"upstream_{status}")
