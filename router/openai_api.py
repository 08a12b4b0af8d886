"""Parse OpenAI request bodies from raw bytes, validate what routing relies on.

FastAPI's pydantic validation stays off the hot path: the body is read as bytes, parsed
once with orjson, and checked field by field for exactly what the router and a replica
would choke on (the body's own bytes are forwarded unchanged). Anything malformed raises
``BadRequest`` naming the offending ``param``, which reaches the client as an OpenAI error.

Session key (what ``fixed`` and ``alternating`` stick on): the ``X-Session-ID`` header,
else the body's ``user`` (either hashed, xxh3-128, to a fixed 34 characters), else xxh3-64
of the model, the system prompt and the first user message, which stay the same across
the turns of one chat; all three are scoped by the body's ``cache_salt`` (with tenants,
the tenant's salt), so tenants never share a session.

Bodies are parsed by ``router.bodies.load_json``: nesting past its limit is a 400.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import orjson
import xxhash

from policies.options import OptionError, coerce
from router.errors import BadRequest
from router.jsonbody import load_json

Endpoint = Literal["chat", "completions"]

_NUMBER_FIELDS = ("temperature", "top_p", "presence_penalty", "frequency_penalty", "min_p",
                  "repetition_penalty")
_INT_FIELDS = ("max_tokens", "max_completion_tokens", "n", "seed", "top_k", "best_of")
_NON_NEGATIVE = ("max_tokens", "max_completion_tokens", "n")
_U32 = 2**32


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
    # Pass-through routes (``router.passthrough``): ``label`` names the route in metrics and
    # in the policy's view; ``hashed`` false: no prompt prefix to look up (load-balanced);
    # ``replica`` pins the request to the replica holding what it names (a stored response).
    label: str = ""
    hashed: bool = True
    replica: str | None = None

    @property
    def route(self) -> str:
        return self.label or self.endpoint


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def lax_number(value: Any) -> float | None:
    """pydantic's lax ``float``, as vLLM reads its fields: numbers, bools and numeric
    strings; ``None`` when it cannot be one."""
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            return None
    return None


def lax_int(value: Any) -> int | None:
    """pydantic's lax ``int``: ints, bools, floats without a fraction (``2.0``), and strings
    of those; ``None`` otherwise."""
    if isinstance(value, int):
        return int(value)
    number = lax_number(value)
    if number is None or not number.is_integer():
        return None
    return int(number)


def lax_bool(value: Any) -> bool | None:
    """pydantic's lax ``bool``: true/false, 0/1, and the words of ``policies.options``
    plus pydantic's one-letter t/f/y/n."""
    if value is True or value is False:  # what clients send: no trip through coerce's lookups
        return value
    if isinstance(value, str) and value.strip().lower() in ("t", "y", "f", "n"):
        return value.strip().lower() in ("t", "y")
    if isinstance(value, float) and value in (0.0, 1.0):
        return bool(value)
    try:
        return bool(coerce("stream", bool, value))
    except OptionError:
        return None


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


def _token_ids(ids: list[Any]) -> bool:
    """Whether ``ids`` are token ids; 400 for an id outside ``0 .. 2**32 - 1``."""
    if not all(_is_int(t) for t in ids):
        return False
    if any(t < 0 or t >= _U32 for t in ids):
        raise BadRequest("'prompt' token ids must be in 0..4294967295", param="prompt")
    return True


def _validate_prompt(prompt: Any, embeds: Any) -> int:
    if prompt is None and embeds is not None:
        # vLLM: prompt_embeds alone (base64 tensors) is a prompt; nothing to hash.
        if isinstance(embeds, str) or (isinstance(embeds, list) and embeds
                                       and all(isinstance(e, str) for e in embeds)):
            return 0
        raise BadRequest("'prompt_embeds' must be a string or an array of strings",
                         param="prompt_embeds")
    if isinstance(prompt, str):
        return len(prompt)
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return sum(len(p) for p in prompt)
        if _token_ids(prompt):
            return 4 * len(prompt)  # token ids: about four characters each
        if all(isinstance(p, list) and p and _token_ids(p) for p in prompt):
            return 4 * sum(len(p) for p in prompt)
    raise BadRequest(
        "'prompt' (or 'prompt_embeds') is required: a string, an array of strings, or an "
        "array of token ids", param="prompt",
    )


def _session_key(endpoint: Endpoint, body: dict[str, Any], header: str | None) -> str:
    """A fixed-size key (a client's 1 MiB header costs 34 bytes), scoped by ``cache_salt``:
    two tenants sending one X-Session-ID are two sessions."""
    salt = body.get("cache_salt")
    scope = salt.encode() if isinstance(salt, str) else b""
    user = body.get("user")
    given = header or (user if isinstance(user, str) else None)
    if given:
        tag = "s:" if header else "u:"
        return tag + xxhash.xxh3_128_hexdigest(
            b"%d:" % len(scope) + scope + given.encode("utf-8", "surrogatepass"))
    h = xxhash.xxh3_64()
    h.update(b"%d:" % len(scope) + scope)
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
        # A completions prompt has no structure that says where a conversation starts; its
        # first KiB did not identify one: prompts behind one long shared system prompt all
        # became one "session", and session stickiness then sent them all to one replica
        # (vLLM's own benchmark client, timed_trace: 146 of 150 requests on one engine).
        # Without a session header or ``user``, a completions request is its own session;
        # the prefix index, not a guessed session, keeps its turns where their KV is.
        h.update(orjson.dumps(body.get("prompt")))
    return "h:" + h.hexdigest()


def _checked_fields(body: dict[str, Any]) -> tuple[bool, int | None]:
    """Check the sampling fields as vLLM's pydantic (lax mode) would; (stream, max_tokens)."""
    stream = False if body.get("stream") is None else lax_bool(body["stream"])
    if stream is None:
        raise BadRequest("'stream' must be a boolean", param="stream")
    for name in _NUMBER_FIELDS:
        if body.get(name) is not None and lax_number(body[name]) is None:
            raise BadRequest(f"'{name}' must be a number", param=name)
    ints: dict[str, int] = {}
    for name in _INT_FIELDS:
        if body.get(name) is None:
            continue
        value = lax_int(body[name])
        if value is None:
            raise BadRequest(f"'{name}' must be an integer", param=name)
        if name in _NON_NEGATIVE and value < 0:
            # vLLM's SamplingParams: "max_tokens must be at least 1", n likewise.
            raise BadRequest(f"'{name}' must not be negative, got {value}", param=name)
        ints[name] = value
    return stream, ints.get("max_completion_tokens", ints.get("max_tokens"))


def parse_request(endpoint: Endpoint, raw: bytes, session_header: str | None) -> ParsedRequest:
    """Parse and validate one chat or completions body; raise ``BadRequest`` if malformed.

    As lenient as vLLM where vLLM is (``"temperature": "0.5"``, ``"n": 2.0``, no ``model``:
    the replica's served model, completions with only ``prompt_embeds``), as strict where
    it is (negative ``max_tokens``); the body is forwarded as sent either way.
    """
    body = load_json(raw)
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise BadRequest("'model' must be a string", param="model")
    stream, max_tokens = _checked_fields(body)
    if body.get("user") is not None and not isinstance(body["user"], str):
        raise BadRequest("'user' must be a string", param="user")
    salt = body.get("cache_salt")
    if salt is not None and (not isinstance(salt, str) or not salt):
        raise BadRequest("'cache_salt' must be a non-empty string", param="cache_salt")
    if endpoint == "chat":
        chars = _validate_messages(body.get("messages"))
    else:
        chars = _validate_prompt(body.get("prompt"), body.get("prompt_embeds"))
    return ParsedRequest(
        endpoint=endpoint,
        body=body,
        model=model or "",
        stream=stream,
        session=_session_key(endpoint, body, session_header),
        prompt_chars=chars,
        max_tokens=max_tokens,
    )
