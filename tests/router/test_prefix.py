"""Prefix block keys: determinism, chaining, isolation, full blocks only."""

from __future__ import annotations

import random
from typing import Any

import pytest
import xxhash

from router.prefix import (
    bytes_chain,
    chain_for_body,
    render_body,
    root_key,
    token_chain,
)

ROOT = root_key("m")


def words(n_bytes: int, seed: int) -> str:
    rng = random.Random(seed)
    out = []
    size = 0
    while size < n_bytes:
        word = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(1, 9)))
        out.append(word)
        size += len(word) + 1
    return " ".join(out)[:n_bytes]


def chat(*messages: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": list(messages), **extra}


SYSTEM = {"role": "system", "content": words(3000, 1)}
USER1 = {"role": "user", "content": words(2500, 2)}
REPLY1 = {"role": "assistant", "content": words(1800, 3)}
USER2 = {"role": "user", "content": words(900, 4)}


def test_chain_is_deterministic_and_64_bit() -> None:
    body = chat(SYSTEM, USER1)
    first = chain_for_body(body, "chat")
    again = chain_for_body(chat(dict(SYSTEM), dict(USER1)), "chat")
    assert first == again
    assert len(first) == len(render_body(body, "chat")) // 1024
    assert all(0 <= key < 2**64 for key in first)
    assert len(set(first)) == len(first)


def test_only_full_blocks_are_keyed() -> None:
    assert bytes_chain(b"x" * 1023, ROOT) == []
    assert len(bytes_chain(b"x" * 1024, ROOT)) == 1
    assert len(bytes_chain(b"x" * 2047, ROOT)) == 1
    assert bytes_chain(b"x" * 2047, ROOT) == bytes_chain(b"x" * 1024 + b"y" * 1023, ROOT)
    assert len(bytes_chain(b"x" * 4096, ROOT, block_bytes=512)) == 8


def test_equal_blocks_at_different_depths_get_different_keys() -> None:
    # Chaining: a key names its whole prefix, not just its block's content.
    keys = bytes_chain(b"x" * 4096, ROOT)
    assert len(set(keys)) == 4


def test_next_turn_shares_the_previous_turns_blocks() -> None:
    turn1 = chain_for_body(chat(SYSTEM, USER1), "chat")
    turn2 = chain_for_body(chat(SYSTEM, USER1, REPLY1, USER2), "chat")
    assert len(turn1) == 5
    assert len(turn2) > len(turn1)
    assert turn2[: len(turn1)] == turn1


def test_an_edit_changes_only_blocks_from_the_edit_on() -> None:
    base = chain_for_body(chat(SYSTEM, USER1), "chat")
    edited_user = {"role": "user", "content": "CHANGED" + str(USER1["content"])[7:]}
    edited = chain_for_body(chat(SYSTEM, edited_user), "chat")
    # SYSTEM is 3000 bytes: the first two blocks lie wholly before the edit.
    assert edited[:2] == base[:2]
    assert all(a != b for a, b in zip(edited[2:], base[2:], strict=True))


@pytest.mark.parametrize(
    "other",
    [
        {"model": "other"},
        {"cache_salt": "tenant-a"},
    ],
)
def test_model_and_salt_isolate_chains(other: dict[str, Any]) -> None:
    base = chain_for_body(chat(SYSTEM, USER1), "chat")
    isolated = chain_for_body({**chat(SYSTEM, USER1), **other}, "chat")
    assert len(isolated) == len(base)
    assert not set(isolated) & set(base)


def test_lora_isolates_chains() -> None:
    body = chat(SYSTEM, USER1)
    assert not set(chain_for_body(body, "chat", lora="a")) & set(chain_for_body(body, "chat"))


def test_root_key_fields_do_not_run_together() -> None:
    roots = {
        root_key("ab"),
        root_key("a", "b"),
        root_key("a", None, "b"),
        root_key("a", ""),
        root_key("a", None, ""),
        root_key("a"),
    }
    assert len(roots) == 6
    assert root_key("m", "s", "l") == root_key("m", "s", "l")


def test_roles_tools_and_tool_calls_are_part_of_the_prefix() -> None:
    text = words(2048, 5)
    as_user = chain_for_body(chat({"role": "user", "content": text}), "chat")
    as_system = chain_for_body(chat({"role": "system", "content": text}), "chat")
    assert as_user[0] != as_system[0]

    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    with_tools = chain_for_body(chat({"role": "user", "content": text}, tools=tools), "chat")
    assert with_tools[0] != as_user[0]

    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    msgs = [{"role": "user", "content": text}, {"role": "assistant", "tool_calls": [call]}]
    rendered = render_body(chat(*msgs), "chat")
    assert b'"arguments":"{}"' in rendered
    other_call = {**call, "function": {"name": "g", "arguments": "{}"}}
    rendered_other = render_body(chat(msgs[0], {**msgs[1], "tool_calls": [other_call]}), "chat")
    assert rendered != rendered_other


def test_text_parts_render_like_string_content_and_images_count() -> None:
    text = words(3000, 6)
    as_string = chain_for_body(chat({"role": "user", "content": text}), "chat")
    as_part = chain_for_body(
        chat({"role": "user", "content": [{"type": "text", "text": text}]}), "chat"
    )
    assert as_part == as_string
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    with_image = chain_for_body(
        chat({"role": "user", "content": [image, {"type": "text", "text": text}]}), "chat"
    )
    assert not set(with_image) & set(as_string)


def test_completions_text_and_token_prompts() -> None:
    text = words(5000, 7)
    body = {"model": "m", "prompt": text}
    assert chain_for_body(body, "completions") == bytes_chain(text.encode(), ROOT)
    batch = {"model": "m", "prompt": [text, "other"]}
    assert chain_for_body(batch, "completions") == chain_for_body(body, "completions")

    ids = list(range(1000, 1000 + 700))
    token_body = {"model": "m", "prompt": ids}
    # 1 KiB text blocks of packed ids are 256-token blocks: both modes agree.
    assert chain_for_body(token_body, "completions") == token_chain(ids, ROOT, 256)
    assert chain_for_body({"model": "m"}, "completions") == []


def test_token_chain_blocks_and_prefixes() -> None:
    ids = [random.Random(8).randrange(50_000) for _ in range(1000)]
    chain = token_chain(ids, ROOT, block_tokens=256)
    assert len(chain) == 3
    assert token_chain(ids[:512], ROOT, 256) == chain[:2]
    assert token_chain(ids[:511], ROOT, 256) == chain[:1]
    assert len(token_chain(ids, ROOT, block_tokens=100)) == 10
    assert not set(token_chain(ids, root_key("m", "salt"), 256)) & set(chain)
    with pytest.raises(ValueError):
        token_chain(ids, ROOT, 0)


def test_malformed_bodies_hash_without_raising() -> None:
    assert chain_for_body({"messages": "nope"}, "chat") == []
    odd = {"model": 3, "messages": [7, {"role": None, "content": {"x": 1}}, "s" * 2000]}
    assert len(chain_for_body(odd, "chat")) == len(render_body(odd, "chat")) // 1024 == 1


def test_pack_token_ids_is_u32_little_endian() -> None:
    from router.prefix import pack_token_ids

    assert pack_token_ids([1, 0x01020304, 2**32 - 1]) == (
        b"\x01\x00\x00\x00" + b"\x04\x03\x02\x01" + b"\xff\xff\xff\xff")
    assert pack_token_ids([]) == b""
    for bad in ([-1], [2**32]):
        with pytest.raises(ValueError):
            pack_token_ids(bad)


def test_keys_are_pinned() -> None:
    """The keys themselves never change: Redis indexes written by other router versions
    and engine-event keys (token mode) must keep meeting them. Pinned values, and the
    definition ``k_i = xxh3_64(block_i, seed=k_{i-1})`` recomputed here."""
    body = {"model": "m", "cache_salt": "t1", "messages": [
        {"role": "system", "content": "x" * 3000}, {"role": "user", "content": "héllo wörld " * 300}]}
    keys = chain_for_body(body, "chat")
    assert len(keys) == 7
    assert keys[:4] == [11464563685211577417, 15416087456166315612, 6790224691617133175,
                        14633892636844520289]
    assert token_chain(list(range(1024)), ROOT)[:4] == [
        8398316080864687735, 8280790523974500358, 12431521000344011770, 5840964587391369276]
    data = render_body(body, "chat")
    parent, expected = root_key("m", "t1"), []
    for start in range(0, len(data) - 1023, 1024):
        parent = xxhash.xxh3_64_intdigest(data[start : start + 1024], seed=parent)
        expected.append(parent)
    assert keys == expected
    assert bytes_chain(data[:5000], ROOT, block_bytes=7) == bytes_chain(data[:4998], ROOT, 7)
