"""Parse OpenAI request bodies from raw bytes, validate what routing relies on.

FastAPI's pydantic validation stays off the hot path: the body is read as bytes, parsed
once with orjson, and checked field by field for exactly what the router and a replica
would choke on (the body's own bytes are forwarded unchanged). Anything malformed raises
``BadRequest`` naming the offending ``param``, which reaches the client as an OpenAI error.

Session key (what ``fixed`` and ``alternating`` stick on): the ``X-Session-ID`` header,
else the body's ``user``, else xxh3-64 of the model, the system prompt and the first user
message, which stay the same across the turns of one chat.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import orjson
import xxhash

from router.errors import BadRequest

Endpoint = Literal["chat", "completions"]

_NUMBER_FIELDS = ("temperature", "top_p", "presence_penalty", "frequency_penalty")
_INT_FIELDS = ("max_tokens", "max_completion_tokens", "n", "seed", "top_k")


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    """A validated OpenAI body: the parsed object plus what routing needs from it."""

    endpoint: Endpoint
    body: dict[str, Any]
    model: str
    stream: bool
    session: str
    prompt_chars: int
    max_tokens: int | None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _content_chars(content: Any, where: str) -> int:
    """Length of a message's text content; validates the content shape."""
    if content is None:
        return 0
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        total = 0
        for i, part in enumerate(content):
            if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                raise BadRequest(f"{where}.content[{i}] must be an object with a 'type'",
                                 param=f"{where}.content")
            text = part.get("text")
            if text is not None and not isinstance(text, str):
                raise BadRequest(f"{where}.content[{i}].text must be a string",
                                 param=f"{where}.content")
            total += len(text or "")
        return total
    raise BadRequest(f"{where}.content must be a string, a list of parts, or null",
                     param=f"{where}.content")


def _validate_messages(messages: Any) -> int:
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty array", param="messages")
    chars = 0
    for i, msg in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise BadRequest(f"{where} must be an object", param="messages")
        if not isinstance(msg.get("role"), str):
            raise BadRequest(f"{where}.role must be a string", param="messages")
        chars += _content_chars(msg.get("content"), where)
    return chars


def _validate_prompt(prompt: Any) -> int:
    if isinstance(prompt, str):
        return len(prompt)
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return sum(len(p) for p in prompt)
        if all(_is_int(p) for p in prompt):
            return 4 * len(prompt)  # token ids: about four characters each
        if all(isinstance(p, list) and all(_is_int(t) for t in p) for p in prompt):
            return 4 * sum(len(p) for p in prompt)
    raise BadRequest(
        "'prompt' must be a string, an array of strings, or an array of token ids",
        param="prompt",
    )


def _session_key(endpoint: Endpoint, body: dict[str, Any], header: str | None) -> str:
    if header:
        return header
    user = body.get("user")
    if isinstance(user, str) and user:
        return "user:" + user
    h = xxhash.xxh3_64()
    h.update(str(body.get("model", "")).encode())
    if endpoint == "chat":
        first_user_seen = False
        for msg in body["messages"]:
            role = msg.get("role")
            if role in ("system", "developer") or (role == "user" and not first_user_seen):
                h.update(b"\x00" + str(role).encode() + b"\x00")
                h.update(orjson.dumps(msg.get("content")))
                first_user_seen = first_user_seen or role == "user"
            if first_user_seen:
                break
    else:
        prompt = body["prompt"]
        first = prompt if isinstance(prompt, str) else prompt[0]
        # A completions prompt grows turn by turn; its first KiB identifies the session.
        h.update(orjson.dumps(first)[:1024])
    return "h:" + h.hexdigest()


def parse_request(endpoint: Endpoint, raw: bytes, session_header: str | None) -> ParsedRequest:
    """Parse and validate one chat or completions body; raise ``BadRequest`` if malformed."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}", code="invalid_json") from exc
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("'model' is required and must be a non-empty string", param="model")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise BadRequest("'stream' must be a boolean", param="stream")
    for name in _NUMBER_FIELDS:
        if body.get(name) is not None and not _is_number(body[name]):
            raise BadRequest(f"'{name}' must be a number", param=name)
    for name in _INT_FIELDS:
        if body.get(name) is not None and not _is_int(body[name]):
            raise BadRequest(f"'{name}' must be an integer", param=name)
    if body.get("user") is not None and not isinstance(body["user"], str):
        raise BadRequest("'user' must be a string", param="user")
    if body.get("cache_salt") is not None and not isinstance(body["cache_salt"], str):
        raise BadRequest("'cache_salt' must be a string", param="cache_salt")
    if endpoint == "chat":
        chars = _validate_messages(body.get("messages"))
    else:
        if "prompt" not in body:
            raise BadRequest("'prompt' is required", param="prompt")
        chars = _validate_prompt(body["prompt"])
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    return ParsedRequest(
        endpoint=endpoint,
        body=body,
        model=model,
        stream=stream,
        session=_session_key(endpoint, body, session_header),
        prompt_chars=chars,
        max_tokens=max_tokens,
    )
