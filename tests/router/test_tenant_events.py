"""Precise mode with tenants: the salt the router sends as ``cache_salt`` comes back in the
engine's KV events (the emulated replica folds it into its first block as vLLM does), and
the keys the router derives from those events equal the keys it routes with."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from servers import Server, replica, router
from servers_redis import free_port
from test_events import make_tokenizer

from router.tenants import Tenants, combine

MODEL = "emulated-27b"
ADMIN = "admin-secret"
KEYS = '[tenants.a]\nkeys = ["sk-a"]\n\n[tenants.b]\nkeys = ["sk-b"]\n'


def _lookup(url: str, ids: list[int], salt: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {"model": MODEL, "prompt": ids}
    if salt is not None:
        body["cache_salt"] = salt
    r = httpx.post(url + "/index/lookup?endpoint=completions", json=body,
                   headers={"authorization": f"Bearer {ADMIN}"})
    assert r.status_code == 200, r.text
    return dict(r.json())


def _send(url: str, key: str, ids: list[int]) -> None:
    r = httpx.post(url + "/v1/completions", json={"model": MODEL, "prompt": ids, "max_tokens": 1},
                   headers={"authorization": f"Bearer {key}"}, timeout=30)
    assert r.status_code == 200, r.text


def test_salted_event_keys_match_the_routers_keys(start_servers: Callable[[Server], Server],
                                                  tmp_path: Path) -> None:
    keys = tmp_path / "tenants.toml"
    keys.write_text(KEYS)
    tenants = Tenants.from_file(keys)
    salt_a = combine(tenants.lookup("sk-a").salt, None)  # type: ignore[union-attr]
    salt_b = combine(tenants.lookup("sk-b").salt, None)  # type: ignore[union-attr]
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    rep = start_servers(replica("--profile", "tiny", "--block-size", "8", "--time-scale", "0.01",
                                "--kv-events-endpoint", endpoint))
    tok = make_tokenizer(tmp_path, "{% for m in messages %}{{ m['content'] }}{% endfor %}")
    lm = start_servers(router([rep.url], "--tokenizer", str(tok), "--block-tokens", "16",
                              "--kv-events", f"{rep.url}={endpoint}", "--api-keys", str(keys),
                              "--admin-key", ADMIN, "--policy", "prefix_affinity"))
    # Until the router's SUB socket has joined, send throwaway prompts.
    deadline = time.monotonic() + 20
    n = 0
    while httpx.get(lm.url + "/replicas", headers={"authorization": f"Bearer {ADMIN}"}
                    ).json()["replicas"][0]["index"]["mode"] != "precise":
        assert time.monotonic() < deadline, "no KV events reached the router"
        n += 1
        _send(lm.url, "sk-b", [1000 + n] * 48)
        time.sleep(0.1)
    # Now the replica is precise: its GPU residency comes only from its events.
    ids = list(range(1, 65))  # four 16-token blocks
    _send(lm.url, "sk-a", ids)
    found: dict[str, Any] = {}
    while time.monotonic() < deadline:
        found = _lookup(lm.url, ids, salt_a)
        if found["gpu"]:
            break
        time.sleep(0.05)
    assert found["chain_blocks"] == 4 and found["gpu"] == {rep.url: 4}
    # The same ids under another tenant's salt, or none, are not there.
    assert _lookup(lm.url, ids, salt_b)["gpu"] == {}
    assert _lookup(lm.url, ids, None)["gpu"] == {}
    status = httpx.get(lm.url + "/replicas", headers={"authorization": f"Bearer {ADMIN}"}).json()
    assert status["replicas"][0]["index"]["unresolved_blocks"] == 0
