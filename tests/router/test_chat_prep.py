"""vLLM's chat preprocessing in token mode (router.chat_prep), without vLLM: what each
step hands the template, checked through the real ChatTokenizer on a tiny local tokenizer.
The real-vLLM comparison is tests/e2e/test_vllm_parity.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from test_events import make_tokenizer

from router.chat_prep import content_format, template_args
from router.tokenizer import ChatTokenizer, TemplateFailed, environment

TOOL_TEMPLATE = (
    "{% if tools %}T:{{ tools | tojson }}|{% endif %}{% if hint is defined %}H:{{ hint }}|"
    "{% endif %}{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}"
    "{% for c in m['tool_calls'] or [] %}[{{ c['function']['name'] }} "
    "{{ c['function']['arguments'] | tojson }}]{% endfor %}"
    "{% if m['tool_call_id'] %}#{{ m['tool_call_id'] }}{% endif %}{{ eos_token }}{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)
PARTS_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{% if m['content'] is string %}{{ m['content'] }}"
    "{% else %}{% for p in m['content'] %}{% if p['type'] == 'text' %}{{ p['text'] }}"
    "{% else %}<{{ p['type'] }}>{% endif %};{% endfor %}{% endif %}{% endfor %}"
)


def tokenizer(tmp_path: Path, template: str) -> ChatTokenizer:
    return ChatTokenizer.from_dir(make_tokenizer(tmp_path, template))


def assistant_call(arguments: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}]}


@pytest.mark.parametrize(("arguments", "rendered"), [
    ('{"city": "Oslo", "n": 2}', '{"city": "Oslo", "n": 2}'),
    ({"city": "Oslo"}, '{"city": "Oslo"}'),
    ("{not json", "{}"), ("", "{}"), ("[1, 2]", "{}"), (None, "{}"), ("42", "{}"),
])
def test_tool_call_arguments_become_objects(tmp_path: Path, arguments: Any, rendered: str) -> None:
    tok = tokenizer(tmp_path, TOOL_TEMPLATE)
    text = tok.render_chat({"messages": [{"role": "user", "content": "q"},
                                         assistant_call(arguments)]})
    assert f"[f {rendered}]" in text
    assert f"<assistant>[f {rendered}]</s>" in text  # content None renders as ""


def test_tool_results_tools_and_empty_call_lists(tmp_path: Path) -> None:
    tok = tokenizer(tmp_path, TOOL_TEMPLATE)
    tools = [{"type": "function", "extra": 1,
              "function": {"name": "f", "strict": True, "unknown": 2}}]
    text = tok.render_chat({"tools": tools, "messages": [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a", "tool_calls": []},
        {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "r1"},
                                                            {"type": "text", "text": "r2"}]}]})
    dumped = [{"type": "function", "function": {"name": "f", "description": None,
                                                "parameters": None, "strict": True}}]
    assert text.startswith(f"T:{json.dumps(dumped)}|")
    assert "<assistant>a</s>" in text  # an empty tool_calls list is dropped
    assert "<tool>r1\nr2#c1</s>" in text


def test_content_parts_by_template_format(tmp_path: Path) -> None:
    env = environment()
    assert content_format(env, TOOL_TEMPLATE) == "string"
    assert content_format(env, PARTS_TEMPLATE) == "openai"
    image = {"type": "image_url", "image_url": {"url": "data:,"}}
    parts = [{"type": "text", "text": "a"}, {"type": "input_text", "text": "b"},
             {"type": "refusal", "refusal": "c"}, {"type": "text", "text": None}, "d"]
    body = {"messages": [{"role": "user", "content": parts}]}
    assert tokenizer(tmp_path, TOOL_TEMPLATE).render_chat(body) == "<user>a\nb\nc\nd</s><assistant>"
    with pytest.raises(TemplateFailed, match="placeholder"):  # the model class decides it
        tokenizer(tmp_path, TOOL_TEMPLATE).render_chat(
            {"messages": [{"role": "user", "content": [*parts, image]}]})
    (tmp_path / "chat_template.jinja").write_text(PARTS_TEMPLATE)
    text = ChatTokenizer.from_dir(tmp_path).render_chat(
        {"messages": [{"role": "user", "content": [*parts, image]}]})
    assert text == "<user>a;b;c;d;<image>;"


def test_generation_prompt_continue_final_message_and_kwargs(tmp_path: Path) -> None:
    tok = tokenizer(tmp_path, TOOL_TEMPLATE)
    chat = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "The answer"}]
    assert tok.render_chat({"messages": chat}).endswith("</s><assistant>")
    assert tok.render_chat({"messages": chat, "add_generation_prompt": False}).endswith("</s>")
    cont = {"messages": chat, "add_generation_prompt": False, "continue_final_message": True}
    assert tok.render_chat(cont) == "<user>q</s><assistant>The answer"
    with pytest.raises(TemplateFailed):
        tok.render_chat({**cont, "add_generation_prompt": True})
    kwargs = {"hint": "h", "add_generation_prompt": True, "eos_token": None}
    text = tok.render_chat({"messages": chat[:1], "add_generation_prompt": False,
                            "chat_template_kwargs": kwargs})
    assert text == "H:h|<user>q</s>"  # the request's flag wins; None overrides nothing


def test_developer_messages_and_billing_header(tmp_path: Path) -> None:
    tok = tokenizer(tmp_path, TOOL_TEMPLATE)
    body = {"messages": [
        {"role": "system", "content": "x-anthropic-billing-header: cch=9\ns1"},
        {"role": "user", "content": "u", "name": "ann", "other": 1},
        {"role": "developer", "content": "d1"}]}
    assert tok.render_chat(body) == "<system>s1\n\nd1</s><user>u</s><assistant>"
    args = template_args(body, TOOL_TEMPLATE + "{# 'developer' #}", environment(), {})
    assert [m["role"] for m in args["messages"]] == ["system", "user", "developer"]
    assert args["messages"][1] == {"role": "user", "content": "u", "name": "ann"}


def test_generation_blocks_and_bad_bodies(tmp_path: Path) -> None:
    template = ("{% for m in messages %}{% generation %}{{ m['content'] }}"
                "{% endgeneration %}{% endfor %}")
    tok = tokenizer(tmp_path, template)
    assert tok.render_chat({"messages": [{"role": "user", "content": "x"}]}) == "x"
    for bad in ({"messages": []}, {"messages": [{"content": "no role"}]},
                {"messages": [{"role": "assistant", "tool_calls": [{"type": "web"}]}]}):
        with pytest.raises(TemplateFailed):
            tok.render_chat(bad)


def test_variables_defined_as_transformers_defines_them(tmp_path: Path) -> None:
    template = ("{{ tools is defined }} {{ documents is defined }} "
                "{{ continue_final_message is defined }} {{ unk_token }}"
                "{% for m in messages %}|{{ m['content'] }}{% endfor %}")
    tok = tokenizer(tmp_path, template)
    body = {"messages": [{"role": "assistant", "content": "go"}], "add_generation_prompt": False,
            "continue_final_message": True}
    assert tok.render_chat(body) == "True True False |go"
    with pytest.raises(TemplateFailed):
        tok.render_chat({**body, "chat_template_kwargs": {"tokenize": True}})
