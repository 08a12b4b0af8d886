"""vLLM's chat preprocessing, reproduced: what the engine hands its chat template.

Token mode must render the text vLLM renders (vLLM 0.32: ``renderers/chat_utils.py`` and
``renderers/hf.py``, then transformers' ``apply_chat_template``), or the router's block
chain leaves the engine's at the first difference. Steps, in vLLM's order:

1. Content format: "openai" when the template loops over a message's content
   (``{% for part in message['content'] %}``), else "string". vLLM's AST detection,
   simplified: a ``for`` whose iterable is ``X.content``, ``X['content']`` or ``content``.
2. Each message is rebuilt with only what vLLM keeps: role and content, then per role
   ``tool_calls`` and ``reasoning`` (also as ``reasoning_content``) for assistants,
   ``tool_call_id`` for tools, ``tools`` for developers, and ``name``/``task`` strings.
   Content None is "" (an empty part list); a string stays a string; a list of parts:
   text parts (text, input_text, output_text: ``text``; refusal; thinking; bare strings)
   are joined with "\\n" in string format, or kept as ``{"type": "text", "text"}`` dicts
   in openai format, where media parts become ``{"type": "image"|"audio"|"video"}``. A
   system message's leading Claude Code billing-header line is dropped.
3. Assistant tool calls: an empty list is dropped; ``arguments`` given as a JSON string
   is parsed; missing, empty, invalid or non-object arguments become ``{}``.
4. "developer" messages become "system" (all system messages merged into one leading
   message, joined by a blank line) when the template never names the developer role.
5. Tools as vLLM's pydantic models dump them: ``{"type": "function", "function":
   {"name", "description", "parameters", ["strict"], ["defer_loading"]},
   ["defer_loading"]}`` (absent description/parameters are None; unknown keys dropped).
6. Template arguments, later ones winning, None and "auto" never overriding: the
   tokenizer's special tokens, ``tools``, the body's ``chat_template_kwargs``, then
   ``add_generation_prompt`` (default true), ``continue_final_message``, ``documents``,
   ``reasoning_effort`` (and ``enable_thinking`` from it unless the kwargs set it).
   ``tools`` and ``documents`` are always defined (None when absent), as transformers
   passes them; ``continue_final_message`` is not a template variable.
7. ``continue_final_message`` (transformers): a tag is appended to the final message's
   content (its last text part in openai format), the text is cut at the tag.

Not reproducible without the model's Python class, so refused with ``TemplateFailed``
(the body then routes without locality): media parts with a string-format template
(vLLM writes the model's own placeholder text), ``prompt_embeds`` parts, and bodies vLLM
itself rejects (continue_final_message with add_generation_prompt, a tool call that is
not a function object).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import jinja2
from jinja2 import nodes


class TemplateFailed(ValueError):
    """The chat template could not render this body (or vLLM would refuse it)."""


TEXT_KEYS = {"text": "text", "input_text": "text", "output_text": "text",
             "refusal": "refusal", "thinking": "thinking"}
MEDIA = {"image_url": "image", "input_image": "image", "image_pil": "image",
         "image_embeds": "image", "audio_url": "audio", "input_audio": "audio",
         "audio_embeds": "audio", "video_url": "video", "video_embeds": "video"}
# vLLM's _KNOWN_CONTENT_PART_FIELDS (0.32): any other key of a part reaches the template.
KNOWN_PART_KEYS = {"audio_embeds", "audio_url", "closed", "data", "file", "image_embeds",
                   "image_pil", "image_url", "input_audio", "name", "prompt_cache_breakpoint",
                   "refusal", "text", "thinking", "type", "uuid", "video_embeds", "video_url"}
BILLING_HEADER = "x-anthropic-billing-header"
CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "
UNSET = (None, "auto")


def content_format(env: jinja2.Environment, template: str) -> str:
    """"openai" when the template iterates a message's content, else "string"."""
    try:
        tree = env.parse(template)
    except jinja2.TemplateSyntaxError:
        return "string"
    for loop in tree.find_all(nodes.For):
        it = loop.iter
        if isinstance(it, nodes.Name) and it.name == "content":
            return "openai"
        if isinstance(it, nodes.Getattr) and it.attr == "content":
            return "openai"
        if (isinstance(it, nodes.Getitem) and isinstance(it.arg, nodes.Const)
                and it.arg.value == "content"):
            return "openai"
    return "string"


def _part(part: Any, openai: bool) -> Any:
    """One content part as vLLM parses it: text, a media marker, or None (skipped)."""
    if isinstance(part, str):
        return {"type": "text", "text": part} if openai else part
    if not isinstance(part, Mapping):
        raise TemplateFailed("a content part must be an object or a string")
    kind = part.get("type")
    if kind is None or part.get("uuid") is not None:
        kind = next((k for k in (*MEDIA, "prompt_embeds", "tool_reference") if k in part), None)
    if kind in TEXT_KEYS:
        text = part.get(TEXT_KEYS[kind])
        if text is None:
            return None
        extra = {k: v for k, v in part.items() if k not in KNOWN_PART_KEYS}
        return {"type": "text", "text": text, **extra} if openai else text
    if kind == "tool_reference":
        name = part.get("name")
        return {"type": "tool_reference", "name": name} if openai else name
    if kind in MEDIA and openai:
        extra = {k: v for k, v in part.items() if k not in KNOWN_PART_KEYS}
        return {"type": MEDIA[kind], **extra}
    raise TemplateFailed(f"content part {kind!r}: unsupported here, or its placeholder "
                         "depends on the model")


def _content(role: str, content: Any, openai: bool) -> Any:
    if content is None:
        content = []
    elif isinstance(content, str):
        content = [content]
    elif not isinstance(content, list):
        raise TemplateFailed("message content must be a string or a list of parts")
    if role == "system":
        content = _strip_billing_header(content)
    parts = [p for p in (_part(p, openai) for p in content) if p is not None]
    if not openai:
        return "\n".join(str(p) for p in parts)
    if role == "tool" and all(p.get("type") == "text" for p in parts):
        return "\n".join(str(p["text"]) for p in parts)
    return parts


def _strip_billing_header(parts: list[Any]) -> list[Any]:
    """Claude Code's attribution line changes every request; vLLM drops it."""
    out: list[Any] = []
    for part in parts:
        is_dict = isinstance(part, Mapping) and part.get("type") == "text"
        text = part.get("text") if is_dict else part
        if not (isinstance(text, str) and text.startswith(BILLING_HEADER)):
            out.append(part)
            continue
        rest = text.partition("\n")[2]
        if rest:
            out.append({**part, "text": rest} if is_dict else rest)
    return out


def _message(message: Any, openai: bool) -> dict[str, Any]:
    if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
        raise TemplateFailed("each message needs a role")
    role = message["role"]
    out: dict[str, Any] = {"role": role, "content": _content(role, message.get("content"), openai)}
    if role == "assistant":
        if message.get("tool_calls") is not None:
            out["tool_calls"] = _tool_calls(message["tool_calls"])
        if message.get("reasoning") is not None:
            out["reasoning"] = out["reasoning_content"] = message["reasoning"]
    elif role == "tool" and "tool_call_id" in message:
        out["tool_call_id"] = message["tool_call_id"]
    for key in ("name", "task"):
        if isinstance(message.get(key), str):
            out[key] = message[key]
    if role == "developer":
        out["tools"] = message.get("tools")
    if out.get("tool_calls") == []:
        del out["tool_calls"]  # an empty list would take templates off the plain path
    return out


def _tool_calls(calls: Any) -> list[dict[str, Any]]:
    """Copies of the calls with ``arguments`` as an object, as chat templates expect."""
    if not isinstance(calls, list):
        raise TemplateFailed("tool_calls must be a list")
    out = []
    for call in calls:
        if not isinstance(call, Mapping):
            raise TemplateFailed("assistant tool_calls entries must be objects")
        function = call.get("function")
        if call.get("type", "function") != "function" or not isinstance(function, Mapping):
            raise TemplateFailed("only tool calls of type 'function' are supported")
        out.append({**call, "function": {**function, "arguments": _arguments(function)}})
    return out


def _arguments(function: Mapping[str, Any]) -> Any:
    raw = function.get("arguments")
    if not raw:
        return {}
    parsed = raw
    if isinstance(raw, str):
        try:
            parsed = json.loads(raw)
        except json.JSONDecodeError:
            return {}  # vLLM coerces, so one bad turn does not break the conversation
    return parsed if isinstance(parsed, dict) else {}


def _developer_to_system(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if not any(m["role"] == "developer" for m in messages):
        return messages
    converted = [{k: v for k, v in m.items() if k != "tools"} | {"role": "system"}
                 if m["role"] == "developer" else m for m in messages]
    texts: list[str] = []
    rest: list[dict[str, Any]] = []
    merged = False
    for i, m in enumerate(converted):
        if m["role"] != "system":
            rest.append(m)
            continue
        merged = merged or i > 0 or bool(texts)
        content = m.get("content", "")
        if isinstance(content, list):
            content = "\n".join(p["text"] if isinstance(p, Mapping) else p for p in content
                                if isinstance(p, str) or (isinstance(p, Mapping) and "text" in p))
        if content:
            texts.append(content)
    return [{"role": "system", "content": "\n\n".join(texts)}, *rest] if merged else converted


def _tool(tool: Any) -> Any:
    if not isinstance(tool, Mapping) or not isinstance(tool.get("function"), Mapping):
        raise TemplateFailed("each tool needs a function")
    fn = tool["function"]
    function = {"name": fn.get("name"), "description": fn.get("description"),
                "parameters": fn.get("parameters")}
    defer = tool.get("defer_loading")
    for key, value in (("strict", fn.get("strict")),
                       ("defer_loading", fn.get("defer_loading", defer))):
        if value is not None:
            function[key] = value
    out: dict[str, Any] = {"type": tool.get("type", "function"), "function": function}
    if defer is not None:
        out["defer_loading"] = defer
    return out


def merge(base: Mapping[str, Any], over: Mapping[str, Any] | None) -> dict[str, Any]:
    """vLLM's merge_kwargs: ``over`` wins except where its value is None or "auto"."""
    return {**base, **{k: v for k, v in (over or {}).items() if v not in UNSET}}


def template_args(body: Mapping[str, Any], template: str, env: jinja2.Environment,
                  special: Mapping[str, str]) -> dict[str, Any]:
    """Everything the template is rendered with, ``messages`` included."""
    openai = content_format(env, template) == "openai"
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise TemplateFailed("messages must be a non-empty list")
    messages = [_message(m, openai) for m in raw]
    if "'developer'" not in template and '"developer"' not in template:
        messages = _developer_to_system(messages)
    tools = body.get("tools")
    kwargs = body.get("chat_template_kwargs")
    user = kwargs if isinstance(kwargs, Mapping) else {}
    if {"chat_template", "tokenize"} & set(user):
        raise TemplateFailed("chat_template_kwargs may not set chat_template or tokenize")
    request = {k: body.get(k) for k in ("add_generation_prompt", "continue_final_message",
                                        "documents", "reasoning_effort")}
    request["add_generation_prompt"] = body.get("add_generation_prompt", True)
    if body.get("reasoning_effort") is not None and "enable_thinking" not in user:
        request["enable_thinking"] = body["reasoning_effort"] != "none"
    args = merge({"tools": [_tool(t) for t in tools] if isinstance(tools, list) else None},
                 merge(user, request))
    if args.get("continue_final_message") and args.get("add_generation_prompt"):
        raise TemplateFailed("continue_final_message and add_generation_prompt exclude each other")
    # transformers always passes tools and documents (None when absent): ``is defined``
    # holds for both in every template.
    return {**special, "documents": None, **args, "messages": messages}


def render(compiled: Callable[..., str], args: dict[str, Any]) -> str:
    """Render, with transformers' cut after the final message for continue_final_message
    (a parameter of apply_chat_template, not a template variable)."""
    args = dict(args)
    if not args.pop("continue_final_message", False):
        return compiled(**args)
    messages = [dict(m) for m in args["messages"]]
    final = messages[-1].get("content")
    if isinstance(final, list):
        parts = [dict(p) for p in final]
        text_parts = [p for p in parts if "text" in p]
        if not text_parts:
            raise TemplateFailed("continue_final_message: no text in the final message")
        final = text_parts[-1]["text"]
        text_parts[-1]["text"] = final + CONTINUE_TAG
        messages[-1]["content"] = parts
    elif isinstance(final, str):
        messages[-1]["content"] = final + CONTINUE_TAG
    else:
        raise TemplateFailed("continue_final_message: the final message has no content")
    text = compiled(**{**args, "messages": messages})
    if final.strip() not in text or CONTINUE_TAG.strip() not in text:
        raise TemplateFailed("continue_final_message: the template drops the final message")
    at = text.rindex(CONTINUE_TAG.strip())
    return text[:at] if text[at:at + len(CONTINUE_TAG)] == CONTINUE_TAG else text[:at].rstrip()
