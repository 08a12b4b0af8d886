"""The OpenAPI paths of the pass-through, fan-out and admin routes (``router.openapi``).

The router does not parse these bodies beyond what routing needs (``router.passthrough``:
the ``model``, and for ``/v1/responses`` and ``/v1/messages`` the prompt), so their schemas
are loose: an object whose routing fields are typed and every other field passes through
(``additionalProperties``) for the replica to judge. The route lists are the ones
``router.passthrough`` and ``router.replicas_admin`` serve, so the document cannot miss a
route added there.

    tenant    /v1/responses (+ GET/DELETE by id, cancel), /v1/messages, the balanced
              routes, /version, the audio uploads (multipart)
    internal  the fan-out routes (LoRA, sleep/wake, reset_prefix_cache, /is_sleeping):
              the admin key when one is set
    admin     /admin/policy, /admin/split/weights, /admin/replicas[/drain]: present only
              with an admin key (they answer 404 without one)
"""

from __future__ import annotations

from typing import Any

from router.passthrough import BALANCED, FAN_OUT_POST, UPLOADS

Security = list[dict[str, list[str]]]
# What the router itself may answer on a routed request (the replica's own statuses pass
# through): bad body, key, unknown model or id, size, media type, tenant limit, upstream.
PROXIED = (400, 401, 404, 413, 415, 429, 502, 503)
_MODEL = {"type": "string", "description": "routes only to replicas serving it (404 if none)"}
_STRING_OR_ARRAY = {"anyOf": [{"type": "string"}, {"type": "array", "items": {}}]}
_ROLE_ITEM = {"type": "object", "required": ["role"], "additionalProperties": True,
              "properties": {"role": {"type": "string"}, "content": _STRING_OR_ARRAY}}
_LORA: dict[str, Any] = {"lora_name": {"type": "string"}, "lora_path": {"type": "string"}}


def _loose(required: tuple[str, ...] = (), **properties: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "object", "additionalProperties": True,
                           "properties": {"model": _MODEL, **properties}}
    if required:
        out["required"] = list(required)
    return out


def _error_ref() -> dict[str, Any]:
    return {"description": "OpenAI-shaped error",
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}


def answers(*codes: int) -> dict[str, Any]:
    """A 200 (the replica's or the router's answer) and the router's error statuses."""
    out: dict[str, Any] = {"200": {"description": "the replica's (or router's) answer"}}
    out.update({str(c): _error_ref() for c in codes})
    return out


def op(security: Security, codes: tuple[int, ...], body: dict[str, Any] | None = None, *,
       media: str = "application/json", required: bool = True,
       id_param: bool = False) -> dict[str, Any]:
    """One operation: its body schema (if any), answers, security, the response id."""
    out: dict[str, Any] = {"responses": answers(*codes), "security": security}
    if body is not None:
        out["requestBody"] = {"required": required, "content": {media: {"schema": body}}}
    if id_param:
        out["parameters"] = [{"name": "response_id", "in": "path", "required": True,
                              "schema": {"type": "string", "minLength": 1}}]
    return out


def _responses_body() -> dict[str, Any]:
    return _loose(("input",), input={"anyOf": [{"type": "string"},
                                               {"type": "array", "items": _ROLE_ITEM}]},
                  instructions={"type": "string"}, previous_response_id={"type": "string"},
                  stream={"type": "boolean"})


def _messages_body() -> dict[str, Any]:
    return _loose(("messages",), messages={"type": "array", "minItems": 1, "items": _ROLE_ITEM},
                  system=_STRING_OR_ARRAY, max_tokens={"type": "integer", "minimum": 1},
                  stream={"type": "boolean"})


def _upload_body() -> dict[str, Any]:
    return {"type": "object", "required": ["file"], "additionalProperties": True,
            "properties": {"file": {"type": "string", "format": "binary"}, "model": _MODEL,
                           "language": {"type": "string"}, "stream": {"type": "boolean"}}}


def tenant_paths(sec: Security) -> dict[str, Any]:
    """The routes a tenant's key opens, beside chat and completions."""
    by_id = "/v1/responses/{response_id}"
    paths: dict[str, Any] = {
        "/v1/responses": {"post": op(sec, PROXIED, _responses_body())},
        by_id: {"get": op(sec, PROXIED, id_param=True),
                "delete": op(sec, PROXIED, id_param=True)},
        by_id + "/cancel": {"post": op(sec, PROXIED, id_param=True)},
        "/v1/messages": {"post": op(sec, PROXIED, _messages_body())},
        "/version": {"get": op(sec, (401, 502, 503))},
    }
    paths |= {p: {"post": op(sec, PROXIED, _loose())} for p in BALANCED}
    paths |= {p: {"post": op(sec, PROXIED, _upload_body(), media="multipart/form-data")}
              for p in UPLOADS}
    return paths


def internal_paths(sec: Security) -> dict[str, Any]:
    """The fan-out routes: every replica, one result each (502 when they disagree)."""
    codes = (400, 401, 404, 413, 415, 502)
    paths: dict[str, Any] = {
        p: {"post": op(sec, codes, _loose(**(_LORA if "lora" in p else {})), required=False)}
        for p in FAN_OUT_POST}
    paths["/is_sleeping"] = {"get": op(sec, (401, 502))}
    return paths


def admin_paths(sec: Security) -> dict[str, Any]:
    """The admin API (``router.admin``, ``router.replicas_admin``)."""
    codes = (400, 401, 404, 413, 415)
    url_field = {"type": "string",
                 "pattern": "^https?://[A-Za-z0-9][A-Za-z0-9.-]*(:[0-9]{1,5})?$"}
    url = {"type": "object", "required": ["url"], "additionalProperties": True,
           "properties": {"url": url_field}}
    drain = {**url, "properties": {"url": url_field, "drain": {"type": "boolean"}}}
    policy = {"type": "object", "required": ["policy"], "additionalProperties": True,
              "properties": {"policy": {"type": "string"}, "options": {"type": "object"}}}
    weights = {"type": "object", "required": ["weights"],
               "properties": {"weights": {"type": "object",
                                          "additionalProperties": {"type": "number"}}}}
    return {
        "/admin/policy": {"get": op(sec, (401,)), "post": op(sec, codes, policy)},
        "/admin/split/weights": {"post": op(sec, codes, weights)},
        "/admin/replicas": {"get": op(sec, (401,)), "post": op(sec, codes, url),
                            "delete": op(sec, codes, url)},
        "/admin/replicas/drain": {"post": op(sec, codes, drain)},
    }
