"""Replicas that join at run time get KV-event subscribers; replicas that leave lose them.

The router runs in token mode with ``--kv-events '*=tcp://{host}:{port+1000}'`` (the
template for every replica the list does not name) in front of emulated replicas that
publish vLLM-format events on their HTTP port + 1000. A replica added through the admin
API or a backends file becomes precise from its own events; removed, its index entries are
forgotten and its later events (prompts sent to it directly) no longer reach the index.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from servers import Server, free_port, replica, router
from test_events import make_tokenizer

from router.event_sources import EventConfig, EventSource

MODEL = "emulated-27b"
OFFSET = 1000
KEY = "admin-key"
ADMIN = {"authorization": f"Bearer {KEY}"}
TEMPLATE = f"*=tcp://{{host}}:{{port+{OFFSET}}}"


def _port_pair() -> int:
    """An HTTP port whose port + OFFSET is free too."""
    for _ in range(100):
        port = free_port()
        if port + OFFSET < 65536:
            with socket.socket() as sock:
                try:
                    sock.bind(("127.0.0.1", port + OFFSET))
                    return port
                except OSError:
                    continue
    raise RuntimeError("no free port pair")


def _publishing_replica() -> Server:
    port = _port_pair()
    return replica("--profile", "tiny", "--block-size", "8", "--time-scale", "0.01",
                   "--kv-events-endpoint", f"tcp://127.0.0.1:{port + OFFSET}", port=port)


def _router(tmp_path: Path, backends: list[str], *extra: str) -> Server:
    tok = make_tokenizer(tmp_path, "{% for m in messages %}{{ m['content'] }}{% endfor %}")
    return router(backends, "--tokenizer", str(tok), "--block-tokens", "16", "--kv-events",
                  TEMPLATE, "--admin-key", KEY, "--policy", "round_robin", *extra)


def _index_of(lm: Server, url: str) -> dict[str, Any] | None:
    for rep in httpx.get(lm.url + "/replicas", headers=ADMIN).json()["replicas"]:
        if rep["url"] == url:
            return dict(rep["index"])
    return None


def _send(url: str, ids: list[int]) -> None:
    r = httpx.post(url + "/v1/completions", json={"model": MODEL, "prompt": ids,
                                                 "max_tokens": 1}, timeout=30)
    assert r.status_code == 200, r.text


def _gpu(lm: Server, ids: list[int]) -> dict[str, int]:
    r = httpx.post(lm.url + "/index/lookup?endpoint=completions",
                   json={"model": MODEL, "prompt": ids}, headers=ADMIN)
    assert r.status_code == 200, r.text
    return dict(r.json()["gpu"])


def _until(predicate: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _becomes_precise(lm: Server, rep: Server, base: int) -> None:
    """Until the router's SUB socket has joined, send throwaway prompts to the replica;
    then a four-block prompt sent to it is in the index as its GPU blocks."""
    n = 0

    def precise() -> bool:
        nonlocal n
        n += 1
        _send(rep.url, [base + 5000 + n] * 48)
        index = _index_of(lm, rep.url)
        return index is not None and index["mode"] == "precise"

    _until(precise, f"no KV events from {rep.url} reached the router")
    ids = list(range(base, base + 64))
    _send(rep.url, ids)
    _until(lambda: _gpu(lm, ids) == {rep.url: 4}, f"{rep.url}'s blocks not indexed")


def _forgotten(lm: Server, rep: Server, base: int) -> None:
    """Out of the set: its entries are gone, and its new events no longer arrive."""
    assert _index_of(lm, rep.url) is None
    assert _gpu(lm, list(range(base, base + 64))) == {}
    later = list(range(base + 100, base + 164))
    _send(rep.url, later)
    time.sleep(1.0)  # generous: an event still subscribed arrives within milliseconds
    assert _gpu(lm, later) == {}


def test_replica_added_by_admin_api_gets_events_and_loses_them(start_servers,
                                                               tmp_path: Path) -> None:
    a, b = (start_servers(_publishing_replica()) for _ in range(2))
    lm = start_servers(_router(tmp_path, [a.url]))
    _becomes_precise(lm, a, 1)  # the static replica: the same template
    add = httpx.post(lm.url + "/admin/replicas", json={"url": b.url}, headers=ADMIN)
    assert add.status_code == 200, add.text
    _becomes_precise(lm, b, 2000)
    assert _index_of(lm, b.url)["endpoint"] == f"tcp://127.0.0.1:{b.port + OFFSET}"  # type: ignore[index]
    gone = httpx.request("DELETE", lm.url + "/admin/replicas", json={"url": b.url},
                         headers=ADMIN)
    assert gone.status_code == 200, gone.text
    _forgotten(lm, b, 2000)
    assert _gpu(lm, list(range(1, 65))) == {a.url: 4}  # the other replica's entries stay
    readd = httpx.post(lm.url + "/admin/replicas", json={"url": b.url}, headers=ADMIN)
    assert readd.status_code == 200
    _becomes_precise(lm, b, 4000)  # back: subscribed again


def test_replica_in_backends_file_gets_events_and_loses_them(start_servers,
                                                             tmp_path: Path) -> None:
    a, c = (start_servers(_publishing_replica()) for _ in range(2))
    listed = tmp_path / "backends"

    def write(*urls: str) -> None:
        tmp = tmp_path / "backends.tmp"
        tmp.write_text("".join(u + "\n" for u in urls))
        tmp.rename(listed)

    write(a.url)
    lm = start_servers(_router(tmp_path, [], "--backends-file", str(listed),
                               "--backends-poll-s", "0.1"))
    _becomes_precise(lm, a, 1)
    write(a.url, c.url)
    _until(lambda: _index_of(lm, c.url) is not None, "c did not join")
    _becomes_precise(lm, c, 2000)
    write(a.url)
    _until(lambda: _index_of(lm, c.url) is None, "c did not leave")
    _forgotten(lm, c, 2000)


def test_template_derives_each_replicas_publishers() -> None:
    config = EventConfig.parse(
        ["http://10.0.0.1:8000"],
        ["*=tcp://{host}:{port-2443}..{port-2442}", "http://10.0.0.9:8000=tcp://h:1"],
        ["*=tcp://{host}:6557..6558"], dynamic=True)
    assert config.sources_for("http://10.0.0.7:8000/") == [
        EventSource("http://10.0.0.7:8000", "tcp://10.0.0.7:5557", False, "tcp://10.0.0.7:6557", 0),
        EventSource("http://10.0.0.7:8000", "tcp://10.0.0.7:5558", False, "tcp://10.0.0.7:6558", 1)]
    assert [s.endpoint for s in config.sources_for("http://[fd00::5]:8000")] == [
        "tcp://[fd00::5]:5557", "tcp://[fd00::5]:5558"]
    assert [s.endpoint for s in config.sources_for("http://10.0.0.9:8000")] == ["tcp://h:1"]
    assert [s.endpoint for s in config.sources_for("http://10.0.0.1:8000")] == [
        "tcp://10.0.0.1:5557", "tcp://10.0.0.1:5558"]
    assert EventConfig.parse(["http://a:1"], ["tcp://h:1"]).sources_for("http://b:2") == []
    with pytest.raises(ValueError):
        config.sources_for("http://10.0.0.2:80")  # port 80 - 2443: out of range
    for events, replay in ((["*=tcp://{host}:1", "*=tcp://{host}:2"], []),
                           (["*=tcp://{host+1}:1"], []), ([], ["*=tcp://{host}:1"])):
        with pytest.raises(ValueError):
            EventConfig.parse([], events, replay)
    with pytest.raises(ValueError):  # not a --backend, and none can join
        EventConfig.parse(["http://a:1"], ["http://b:2=tcp://h:1"])
