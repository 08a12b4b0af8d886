"""Access log: one line per request, plain or JSON; 499 for a client that left; off on
request."""

from __future__ import annotations

import json

import httpx
import pytest
from servers import Server, replica, router

CHAT = {"model": "emulated-27b", "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2}


def _lines(server: Server) -> list[str]:
    return server.log_lines()


def _access(server: Server) -> list[dict[str, object]]:
    out = []
    for line in _lines(server):
        if line.startswith("{"):
            entry = json.loads(line)
            if entry["logger"] == "lmroute.access":
                out.append(entry)
    return out


def test_json_access_log(start_servers) -> None:
    a = start_servers(replica("--ttft", "2"))
    lm = start_servers(router([a.url], "--log-format", "json"))
    r = httpx.post(lm.url + "/v1/completions", json={"model": "emulated-27b", "prompt": "x",
                                                     "max_tokens": 1},
                   headers={"x-request-id": "client-7"}, timeout=10)
    assert r.status_code == 200
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(lm.url + "/v1/chat/completions", json=CHAT, timeout=httpx.Timeout(5, read=0.3))
    httpx.get(lm.url + "/health")
    entries = _access(lm)
    served = next(e for e in entries if e.get("request_id") == "client-7")
    assert served["status"] == 200 and served["replica"] == "r0"
    assert served["policy"] == "locality" and served["reason"]
    assert isinstance(served["ttft_s"], float) and isinstance(served["total_s"], float)
    assert {"time", "level", "path", "tenant"} <= served.keys()
    # The client that timed out is logged 499 once the router noticed.
    import time
    deadline = time.monotonic() + 5
    while not any(e["status"] == 499 for e in _access(lm)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert any(e["status"] == 499 and e["path"] == "/v1/chat/completions" for e in _access(lm))


def test_plain_and_no_access_log(start_servers) -> None:
    a = start_servers(replica())
    plain = start_servers(router([a.url]))
    quiet = start_servers(router([a.url], "--no-access-log"))
    for lm in (plain, quiet):
        assert httpx.post(lm.url + "/v1/chat/completions", json=CHAT).status_code == 200
    line = next(x for x in _lines(plain) if "lmroute.access" in x
                and "/v1/chat/completions" in x)
    assert " INFO lmroute.access: POST /v1/chat/completions 200 " in line
    assert "replica=r0" in line and "total_s=" in line
    assert not any("lmroute.access" in x for x in _lines(quiet))
