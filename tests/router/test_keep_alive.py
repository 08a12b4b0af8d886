"""Idle keep-alive connections are closed by the client side of each hop, never raced.

A server that closes an idle connection just as its client writes a request on it resets
that request (the client sees ``ReadError``/``BrokenPipeError``; bench/keepalive_race.py
shows 12 of 576 requests lost with the old timers). So the router keeps idle client
connections longer than clients do (httpx and the OpenAI SDK expire theirs after 5 s),
and drops idle upstream connections before the replica (vLLM's uvicorn: 5 s) does.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

import httpx
from servers import replica, router

BODY = b'{"model": "emulated-27b", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}'
TIME_WAIT = "06"  # /proc/net/tcp state code


def raw_request(sock: socket.socket, port: int) -> bytes:
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n"
                 b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                 % (port, len(BODY), BODY))
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    while len(rest) < length:
        rest += sock.recv(65536)
    return head


def test_an_idle_client_connection_outlives_the_clients_own_5s_expiry() -> None:
    rep = replica().start()
    lm = router([rep.url], "--no-access-log").start()
    try:
        with socket.create_connection(("127.0.0.1", lm.port), timeout=10) as sock:
            assert raw_request(sock, lm.port).startswith(b"HTTP/1.1 200")
            time.sleep(5.5)  # longer than uvicorn's default (5 s), which the router had
            assert raw_request(sock, lm.port).startswith(b"HTTP/1.1 200")
    finally:
        lm.stop()
        rep.stop()


def closed_by_us(remote_port: int) -> int:
    """Sockets in TIME_WAIT towards ``remote_port``: the active closer keeps TIME_WAIT."""
    count = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] == TIME_WAIT and int(fields[2].split(":")[1], 16) == remote_port:
            count += 1
    return count


def test_the_router_drops_an_idle_upstream_connection_before_the_replica_does() -> None:
    rep = replica().start()  # uvicorn's 5 s keep-alive, as vLLM
    lm = router([rep.url], "--no-access-log", "--upstream-keepalive-s", "1").start()
    try:
        before = closed_by_us(rep.port)
        r = httpx.post(lm.url + "/v1/chat/completions", content=BODY,
                       headers={"content-type": "application/json"})
        assert r.status_code == 200
        time.sleep(2.5)  # past the router's 1 s, well before the replica's 5 s
        assert closed_by_us(rep.port) > before
    finally:
        lm.stop()
        rep.stop()
