"""``GET /openapi.json``: an OpenAPI 3.0 description of every route the router serves.

Chat and completions bodies as the router's parser (``router.openai_api``) takes them,
with vLLM's lax typing (a number may come as a numeric string, ``n`` as ``2.0``), every
other field passed through untouched (``additionalProperties``); the pass-through,
fan-out and admin routes with loose bodies (``router.openapi_surface``: only what routing
reads is typed, the replica judges the rest); and the answers the router itself makes
(400, 401, 404, 413, 415, 429, 502, 503), all in OpenAI's error shape. Internal and
admin routes carry the admin key's security scheme; with ``--api-keys`` the routed ones
(``/v1/...``, ``/tokenize``, ``/version``, ...) carry the tenant key's; the admin API is
listed only when an admin key is set (it answers 404 otherwise). The schemathesis run in
``tests/router/test_schema_fuzz.py`` generates requests from this document.
"""

from __future__ import annotations

from typing import Any

from router.openapi_surface import PROXIED, admin_paths, answers, internal_paths, tenant_paths

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


def _post(body: dict[str, Any], security: list[dict[str, list[str]]],
          codes: tuple[int, ...]) -> dict[str, Any]:
    return {"post": {
        "requestBody": {"required": True, "content": {"application/json": {"schema": body}}},
        "responses": answers(*codes), "security": security}}


def _get(security: list[dict[str, list[str]]], *codes: int) -> dict[str, Any]:
    return {"get": {"responses": answers(*codes), "security": security}}


def openapi_document(*, tenants: bool, admin: bool) -> dict[str, Any]:
    """The document for a router with (or without) tenants and an admin key."""
    tenant_sec: list[dict[str, list[str]]] = [{"tenantKey": []}] if tenants else []
    admin_sec: list[dict[str, list[str]]] = [{"adminKey": []}] if admin else []
    proxied = PROXIED
    paths: dict[str, Any] = {
        "/v1/chat/completions": _post(_chat_body(), tenant_sec, proxied),
        "/v1/completions": _post(_completions_body(), tenant_sec, proxied),
        "/v1/models": _get(tenant_sec, 401),
        "/health": _get([]),
        "/ready": _get([], 503),
        "/metrics": _get([]),
        "/openapi.json": _get([]),
        **tenant_paths(tenant_sec),
    }
    if admin or not tenants:  # internal routes: the admin key's, or anyone's without tenants
        paths |= {
            "/index/lookup": _post(_chat_body(), admin_sec, (400, 401, 413, 415)),
            "/replicas": _get(admin_sec, 401),
            "/policy": _get(admin_sec, 401),
            **internal_paths(admin_sec),
        }
    if admin:  # the admin API is off (404) without a key
        paths |= admin_paths(admin_sec)
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
