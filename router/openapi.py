"""``GET /openapi.json``: an OpenAPI 3.0 description of what the router itself accepts.

Not vLLM's whole API: the request bodies as the router's parser (``router.openai_api``)
takes them, with vLLM's lax typing (a number may come as a numeric string, ``n`` as
``2.0``), every other field passed through untouched (``additionalProperties``), and the
answers the router itself makes (400, 401, 404, 413, 415, 429, 502, 503), all in OpenAI's
error shape. Internal routes carry the admin key's security scheme; with ``--api-keys``
the ``/v1`` routes carry the tenant key's. The schemathesis run in
``tests/router/test_schema_fuzz.py`` generates requests from this document.
"""

from __future__ import annotations

from typing import Any

_U32_MAX = 2**32 - 1
_NUMERIC_TEXT = {"type": "string", "pattern": r"^-?[0-9]{1,6}(\.[0-9]{1,6})?$"}
_NUMBER = {"anyOf": [{"type": "number"}, _NUMERIC_TEXT]}
_COUNT = {"anyOf": [{"type": "integer", "minimum": 0},
                    {"type": "number", "minimum": 0, "multipleOf": 1}]}
_TEXT_PART = {"type": "object", "required": ["type"],
              "properties": {"type": {"type": "string"}, "text": {"type": "string"}}}
_MESSAGE = {
    "type": "object", "required": ["role"],
    "properties": {
        "role": {"type": "string"},
        "content": {"nullable": True, "anyOf": [
            {"type": "string"}, {"type": "array", "items": _TEXT_PART}]},
        "name": {"type": "string"},
    },
}
_TOKEN_IDS = {"type": "array", "minItems": 1,
              "items": {"type": "integer", "minimum": 0, "maximum": _U32_MAX}}


def _sampling() -> dict[str, Any]:
    return {
        "model": {"type": "string", "description": "default: the replica's served model"},
        "stream": {"type": "boolean"},
        "temperature": _NUMBER, "top_p": _NUMBER,
        "presence_penalty": _NUMBER, "frequency_penalty": _NUMBER,
        "max_tokens": _COUNT, "max_completion_tokens": _COUNT, "n": _COUNT,
        "user": {"type": "string"},
        "cache_salt": {"type": "string", "minLength": 1,
                       "description": "combined with the tenant's salt, never replacing it"},
    }


def _chat_body() -> dict[str, Any]:
    return {"type": "object", "required": ["messages"],
            "properties": {**_sampling(),
                           "messages": {"type": "array", "minItems": 1, "items": _MESSAGE}}}


def _completions_body() -> dict[str, Any]:
    prompt = {"anyOf": [
        {"type": "string"},
        {"type": "array", "minItems": 1, "items": {"type": "string"}},
        _TOKEN_IDS,
        {"type": "array", "minItems": 1, "items": _TOKEN_IDS},
    ]}
    return {"type": "object", "required": ["prompt"],
            "properties": {**_sampling(), "prompt": prompt}}


def _error_ref() -> dict[str, Any]:
    return {"description": "OpenAI-shaped error",
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}


def _answers(*codes: int) -> dict[str, Any]:
    out: dict[str, Any] = {"200": {"description": "the replica's (or router's) answer"}}
    out.update({str(c): _error_ref() for c in codes})
    return out


def _post(body: dict[str, Any], security: list[dict[str, list[str]]],
          codes: tuple[int, ...]) -> dict[str, Any]:
    return {"post": {
        "requestBody": {"required": True, "content": {"application/json": {"schema": body}}},
        "responses": _answers(*codes), "security": security}}


def _get(security: list[dict[str, list[str]]], *codes: int) -> dict[str, Any]:
    return {"get": {"responses": _answers(*codes), "security": security}}


def openapi_document(*, tenants: bool, admin: bool) -> dict[str, Any]:
    """The document for a router with (or without) tenants and an admin key."""
    tenant_sec: list[dict[str, list[str]]] = [{"tenantKey": []}] if tenants else []
    admin_sec: list[dict[str, list[str]]] = [{"adminKey": []}] if admin else []
    proxied = (400, 401, 413, 415, 429, 502, 503)
    paths: dict[str, Any] = {
        "/v1/chat/completions": _post(_chat_body(), tenant_sec, proxied),
        "/v1/completions": _post(_completions_body(), tenant_sec, proxied),
        "/v1/models": _get(tenant_sec, 401),
        "/health": _get([]),
        "/ready": _get([], 503),
        "/metrics": _get([]),
    }
    if admin or not tenants:
        paths |= {
            "/index/lookup": _post(_chat_body(), admin_sec, (400, 401, 413, 415)),
            "/replicas": _get(admin_sec, 401),
            "/policy": _get(admin_sec, 401),
        }
    error = {"type": "object", "required": ["error"], "properties": {"error": {
        "type": "object", "required": ["message", "type"],
        "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                       "param": {"type": "string", "nullable": True},
                       "code": {"nullable": True}}}}}
    return {
        "openapi": "3.0.3",
        "info": {"title": "lmroute", "version": "0.1.0",
                 "description": "What the lmroute router accepts (see docs/tenants.md)."},
        "paths": paths,
        "components": {
            "schemas": {"Error": error},
            "securitySchemes": {"tenantKey": {"type": "http", "scheme": "bearer"},
                                "adminKey": {"type": "http", "scheme": "bearer"}},
        },
    }
