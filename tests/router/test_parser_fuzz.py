"""Property-based fuzz of the request parser: any bytes, any JSON, any mix of OpenAI fields
either parse (and then hash into block keys and a fixed-size session key) or are a
``BadRequest`` (a 400); nothing else escapes. The same for body decoding and salting."""

from __future__ import annotations

import gzip
import zlib
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from router.bodies import decode
from router.errors import BadRequest, LmrouteError, PayloadTooLarge
from router.gate import salted
from router.openai_api import parse_request
from router.prefix import chain_for_body
from router.tenants import Tenant

FUZZ = settings(max_examples=400, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow])
scalars = (st.none() | st.booleans() | st.integers(min_value=-(2**63), max_value=2**64 - 1)
           | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20))
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                           max_leaves=30)
token_ids = st.lists(st.integers(min_value=-5, max_value=2**33), min_size=1, max_size=8)
parts = st.lists(st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url", 3])},
                                       optional={"text": json_values}), max_size=3)
messages = st.lists(st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant", 7])},
    optional={"content": st.none() | st.text(max_size=40) | parts | json_values,
              "name": json_values, "tool_calls": json_values}), max_size=4) | json_values
field_values = {
    "model": st.text(max_size=10) | json_values,
    "stream": st.sampled_from([True, False, "true", "no", 1, 2, None, "maybe"]),
    "temperature": st.sampled_from(["0.5", "x", 0.5, 1, None, True, [1]]),
    "n": st.sampled_from([1, 2.0, 2.5, "3", -1, None, "a"]),
    "max_tokens": st.integers(min_value=-3, max_value=10) | st.sampled_from(["4", 4.0, 4.5]),
    "user": st.text(max_size=10) | json_values,
    "cache_salt": st.text(max_size=10) | json_values,
    "messages": messages,
    "prompt": st.text(max_size=40) | token_ids | st.lists(token_ids, max_size=3) | json_values,
    "prompt_embeds": st.text(max_size=10) | json_values,
    "tools": json_values,
}
bodies = st.fixed_dictionaries({}, optional=field_values)


def _parse_or_400(endpoint: Any, raw: bytes, header: str | None) -> None:
    try:
        parsed = parse_request(endpoint, raw, header)
    except BadRequest as err:
        assert err.status == 400 and orjson.loads(err.body())["error"]["message"]
        return
    assert len(parsed.session) <= 34
    chain_for_body(parsed.body, parsed.endpoint, block_bytes=16)


@FUZZ
@given(body=bodies, endpoint=st.sampled_from(["chat", "completions"]),
       header=st.none() | st.text(max_size=200))
def test_structured_bodies_parse_or_are_400(body: dict[str, Any], endpoint: Any,
                                            header: str | None) -> None:
    _parse_or_400(endpoint, orjson.dumps(body), header)


@FUZZ
@given(value=json_values, endpoint=st.sampled_from(["chat", "completions"]))
def test_any_json_parses_or_is_400(value: Any, endpoint: Any) -> None:
    _parse_or_400(endpoint, orjson.dumps(value), None)


@FUZZ
@given(raw=st.binary(max_size=200), depth=st.integers(min_value=0, max_value=400))
def test_any_bytes_and_any_depth_parse_or_are_400(raw: bytes, depth: int) -> None:
    _parse_or_400("chat", raw, None)
    deep = b"[" * depth + b"]" * depth
    _parse_or_400("completions", b'{"prompt": "p", "x": ' + (deep or b"1") + b"}", None)


@FUZZ
@given(body=bodies)
def test_salting_keeps_a_body_parseable_or_refuses_it(body: dict[str, Any]) -> None:
    tenant = Tenant("t", "lmt-0123")
    try:
        out = salted(orjson.dumps(body), tenant)
    except BadRequest:
        return
    assert orjson.loads(out)["cache_salt"].startswith("lmt-")


@FUZZ
@given(data=st.binary(max_size=300), coding=st.sampled_from(["gzip", "deflate"]),
       wrap=st.booleans())
def test_decoding_any_bytes_is_the_data_or_a_4xx(data: bytes, coding: str, wrap: bool) -> None:
    wire = (gzip.compress(data) if coding == "gzip" else zlib.compress(data)) if wrap else data
    try:
        out = decode(wire, [coding], limit=256)
    except (BadRequest, PayloadTooLarge) as err:
        assert isinstance(err, LmrouteError) and err.status in (400, 413)
        assert not wrap or len(data) > 256
        return
    assert not wrap or out == data
