"""Prompt-bearing bodies other than chat and completions, seen as chat for routing.

``/v1/responses`` (``instructions`` + ``input``: a string, or message items whose content
is a string or ``input_text`` parts) and ``/v1/messages`` (Anthropic: ``system`` +
``messages`` whose content is a string or ``text`` blocks) are turned into a chat body
(``model``, ``messages``, ``cache_salt``, ``user``, ``stream``, ``max_tokens``) that
``openai_api.parse_request`` validates and the locator hashes like a chat: the session key
and the prefix chain of one conversation stay the same across its turns, whichever of the
three APIs carries it. vLLM renders both through the model's chat template, so in token
mode the chain is close to the engine's, not byte-exact (non-text items are skipped).

A body that is not one of these (no text at all) is a 400, OpenAI-shaped, from the
parser; the original bytes are what the replica receives either way.
"""

from __future__ import annotations

from typing import Any

from router.errors import BadRequest


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p["text"] for p in content
                       if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def _common(body: dict[str, Any], messages: list[dict[str, Any]],
            max_tokens: str) -> dict[str, Any]:
    out: dict[str, Any] = {"messages": messages}
    for key in ("model", "cache_salt", "user", "stream"):
        if key in body:
            out[key] = body[key]
    if body.get(max_tokens) is not None:
        out["max_tokens"] = body[max_tokens]
    return out


def responses_as_chat(body: dict[str, Any]) -> dict[str, Any]:
    """A ``/v1/responses`` body as the chat body routing hashes."""
    messages: list[dict[str, Any]] = []
    if isinstance(body.get("instructions"), str):
        messages.append({"role": "system", "content": body["instructions"]})
    items = body.get("input")
    if isinstance(items, str):
        messages.append({"role": "user", "content": items})
    elif isinstance(items, list):
        for item in items:
            if isinstance(item, dict) and isinstance(item.get("role"), str):
                messages.append({"role": item["role"], "content": _text(item.get("content"))})
    if not messages:
        raise BadRequest("'input' must be a string or an array of input items", param="input")
    return _common(body, messages, "max_output_tokens")


def messages_as_chat(body: dict[str, Any]) -> dict[str, Any]:
    """An Anthropic ``/v1/messages`` body as the chat body routing hashes."""
    messages: list[dict[str, Any]] = []
    system = _text(body.get("system"))
    if system:
        messages.append({"role": "system", "content": system})
    given = body.get("messages")
    if not isinstance(given, list) or not given:
        raise BadRequest("'messages' must be a non-empty array", param="messages")
    for i, msg in enumerate(given):
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
            raise BadRequest(f"messages[{i}] must be an object with a 'role'", param="messages")
        messages.append({"role": msg["role"], "content": _text(msg.get("content"))})
    return _common(body, messages, "max_tokens")
