"""Token mode's tokenizer: the engine's token ids for an OpenAI body, without transformers.

A local Hugging Face tokenizer directory is read with the light ``tokenizers`` library
(``tokenizer.json``) and ``jinja2`` (the chat template), so request chains hash the same
token ids that vLLM's BlockStored events carry, and keys from both sides meet in the index.

What vLLM does, and so what this does:
- chat: render the chat template (``chat_template.jinja`` beside the tokenizer, as
  transformers >= 4.5x saves it, else ``chat_template`` in ``tokenizer_config.json``; a
  list of named templates picks ``default``) with the messages, tools and arguments that
  vLLM's preprocessing gives it (``router.chat_prep``: tool-call arguments parsed, content
  parts flattened, ``add_generation_prompt``, ``continue_final_message``,
  ``chat_template_kwargs``, the tokenizer's special tokens), in a sandboxed Jinja
  environment configured like transformers' (trim_blocks, lstrip_blocks, loop controls,
  ``tojson``, ``raise_exception``, ``generation`` blocks); then encode the text WITHOUT
  adding special tokens (the template writes them).
- completions: a text prompt is encoded WITH special tokens (the tokenizer's
  post-processor); a prompt of token ids is used as is; a batch routes by its first prompt.

A body the template refuses raises ``TemplateFailed``; the locator then routes it without
locality rather than failing the request (the replica gives the client the real error).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.parser import Parser
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from router.chat_prep import TemplateFailed, render, template_args

__all__ = ["ChatTokenizer", "TemplateFailed"]
# transformers' SPECIAL_TOKENS_ATTRIBUTES: all of them reach the template.
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
                  "mask_token")


def _token_text(value: Any) -> str:
    """``bos_token`` etc. are strings, or AddedToken dicts with a ``content``."""
    if isinstance(value, Mapping):
        return str(value.get("content", ""))
    return value if isinstance(value, str) else ""


def _raise(message: str) -> None:
    raise TemplateFailed(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


class _Generation(Extension):
    """``{% generation %}...{% endgeneration %}`` (assistant masks) renders its body."""

    tags = {"generation"}  # noqa: RUF012 (jinja2 reads it as declared on Extension)

    def parse(self, parser: Parser) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body).set_lineno(lineno)


def environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_Generation, "jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


class ChatTokenizer:
    """Token ids of chat and completions bodies, as the serving engine computes them."""

    def __init__(self, tokenizer: Tokenizer, template: str | None,
                 special: Mapping[str, str]) -> None:
        self._tok = tokenizer
        self._env = environment()
        self._source = template or ""
        self._template = self._env.from_string(template) if template else None
        self._special = {k: v for k, v in special.items() if v}

    @classmethod
    def from_dir(cls, path: str | Path) -> ChatTokenizer:
        root = Path(path)
        if not (root / "tokenizer.json").is_file():
            raise ValueError(f"--tokenizer {root}: no tokenizer.json there")
        tokenizer = Tokenizer.from_file(str(root / "tokenizer.json"))
        config_file = root / "tokenizer_config.json"
        config: dict[str, Any] = json.loads(config_file.read_text()) if config_file.exists() else {}
        template: Any = None
        jinja_file = root / "chat_template.jinja"
        if jinja_file.exists():
            template = jinja_file.read_text()
        else:
            template = config.get("chat_template")
            if isinstance(template, list):  # [{"name": ..., "template": ...}, ...]
                named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
                template = named.get("default")
        special = {k: _token_text(config.get(k)) for k in SPECIAL_TOKENS}
        return cls(tokenizer, template if isinstance(template, str) else None, special)

    def render_chat(self, body: Mapping[str, Any]) -> str:
        if self._template is None:
            raise TemplateFailed("the tokenizer has no chat template")
        args = template_args(body, self._source, self._env, self._special)
        try:
            return render(self._template.render, args)
        except jinja2.TemplateError as exc:
            raise TemplateFailed(str(exc)) from exc
        except TemplateFailed:
            raise
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            raise TemplateFailed(f"{type(exc).__name__}: {exc}") from exc

    def chat_ids(self, body: Mapping[str, Any]) -> list[int]:
        ids: list[int] = self._tok.encode(self.render_chat(body), add_special_tokens=False).ids
        return ids

    def prompt_ids(self, prompt: Any) -> list[int]:
        if isinstance(prompt, str):
            ids: list[int] = self._tok.encode(prompt, add_special_tokens=True).ids
            return ids
        if isinstance(prompt, list) and prompt:
            first = prompt[0]
            if isinstance(first, int):
                return [int(t) for t in prompt]
            return self.prompt_ids(first)
        return []

    def ids(self, body: Mapping[str, Any], endpoint: str) -> Sequence[int]:
        if endpoint == "chat":
            return self.chat_ids(body)
        return self.prompt_ids(body.get("prompt"))
