"""Replicas that come and go: a running router scaled 2 -> 3 -> 2 by the admin API, by its
backends file and by DNS (a hosts-style file), under light continuous load, with no failed
request; a drained replica finishes its in-flight request and gets no new one."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from servers import Server, free_port, replica, router

from router.membership import replica_url

ADMIN = {"authorization": "Bearer admin-key"}
CHAT = {"model": "emulated-27b", "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2}
ROUTER_OPTS = ("--policy", "round_robin", "--expose-replica-header", "--admin-key",
               "admin-key", "--health-interval-s", "0.2")


class Load:
    """Requests one after another from a thread; every status and serving replica kept."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.results: list[tuple[int, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=30) as client:
            while not self._stop.is_set():
                try:
                    r = client.post(self.url + "/v1/chat/completions", json=CHAT)
                    self.results.append((r.status_code, r.headers.get("x-lmroute-replica", "")))
                except httpx.HTTPError as exc:
                    self.results.append((0, repr(exc)))
                time.sleep(0.02)

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def served_by(self, url: str, since: int) -> bool:
        return any(rep == url for _, rep in self.results[since:])

    def until(self, predicate: Callable[[], bool], timeout_s: float = 30.0) -> int:
        """Wait for ``predicate``; the index in ``results`` when it became true."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if predicate():
                return len(self.results)
            time.sleep(0.05)
        raise AssertionError(f"not reached in {timeout_s}s; last: {self.results[-5:]}")


def _scale(lm: Server, a: Server, b: Server, c: Server, grow: Callable[[], None],
           shrink: Callable[[], None]) -> None:
    with Load(lm.url) as load:
        load.until(lambda: len(load.results) >= 5)
        grow()
        grown = load.until(lambda: load.served_by(c.url, 0))
        shrink()
        listed = lambda: c.url not in [r["url"] for r in httpx.get(  # noqa: E731
            lm.url + "/admin/replicas", headers=ADMIN).json()["replicas"]]
        shrunk = load.until(listed)
        load.until(lambda: len(load.results) >= shrunk + 10)
    statuses = [s for s, _ in load.results]
    assert statuses == [200] * len(statuses), load.results
    assert not load.served_by(c.url, shrunk + 1)  # gone: nothing routed there since
    assert {a.url, b.url} <= {rep for _, rep in load.results[grown:]}


def test_scale_by_admin_api(start_servers) -> None:
    a, b, c = (start_servers(replica()) for _ in range(3))
    lm = start_servers(router([a.url, b.url], *ROUTER_OPTS))

    def add() -> None:
        r = httpx.post(lm.url + "/admin/replicas", json={"url": c.url}, headers=ADMIN)
        assert r.status_code == 200, r.text
        joined = {x["url"]: x for x in r.json()["replicas"]}[c.url]
        assert joined["healthy"] and joined["origins"] == ["admin"]
        assert joined["models"] == ["emulated-27b"]

    def remove() -> None:
        r = httpx.request("DELETE", lm.url + "/admin/replicas", json={"url": c.url},
                          headers=ADMIN)
        assert r.status_code == 200, r.text

    _scale(lm, a, b, c, add, remove)
    gone = httpx.request("DELETE", lm.url + "/admin/replicas", json={"url": c.url},
                         headers=ADMIN)
    assert gone.status_code == 404
    assert httpx.get(lm.url + "/admin/replicas").status_code == 401


def test_scale_by_backends_file(start_servers, tmp_path: Path) -> None:
    a, b, c = (start_servers(replica()) for _ in range(3))
    listing = tmp_path / "backends.txt"
    listing.write_text(f"# the fleet\n{a.url}\n\n{b.url}  # second\n")
    lm = start_servers(router([], "--backends-file", str(listing), "--backends-poll-s", "0.1",
                              *ROUTER_OPTS))

    def write(*urls: str) -> Callable[[], None]:
        def go() -> None:
            tmp = tmp_path / "next.txt"
            tmp.write_text("\n".join(urls) + "\n")
            tmp.replace(listing)  # atomically, as a config manager would

        return go

    _scale(lm, a, b, c, write(a.url, b.url, c.url), write(a.url, b.url))


def _replica_on(address: str, port: int) -> Server:
    server = Server(["replica", "--host", address, "--port", str(port)], port, name="replica")
    server.url = f"http://{address}:{port}"
    return server


def test_scale_by_dns(start_servers, tmp_path: Path) -> None:
    port = free_port()
    try:
        a, b, c = (start_servers(_replica_on(f"127.0.0.{i}", port)) for i in (1, 2, 3))
    except RuntimeError as exc:  # the port was taken on another loopback address
        pytest.fail(f"could not bind the three loopback replicas: {exc}")
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 fleet.test\n127.0.0.2 fleet.test other\n")
    lm = start_servers(router([f"dns+http://fleet.test:{port}"], "--dns-hosts-file", str(hosts),
                              "--dns-interval-s", "0.1", *ROUTER_OPTS))

    def write(text: str) -> Callable[[], None]:
        def go() -> None:
            tmp = tmp_path / "hosts.next"
            tmp.write_text(text)
            tmp.replace(hosts)

        return go

    grow = write("127.0.0.1 fleet.test\n127.0.0.2 fleet.test\n127.0.0.3 fleet.test\n")
    _scale(lm, a, b, c, grow, write("127.0.0.1 fleet.test\n127.0.0.2 fleet.test\n"))
    origins = {r["url"]: r["origins"] for r in httpx.get(
        lm.url + "/admin/replicas", headers=ADMIN).json()["replicas"]}
    assert origins == {a.url: [f"dns:dns+http://fleet.test:{port}"],
                       b.url: [f"dns:dns+http://fleet.test:{port}"]}


def test_drained_replica_finishes_in_flight_and_gets_no_new_request(start_servers) -> None:
    slow = start_servers(replica("--tpot", "0.1"))
    other = start_servers(replica())
    lm = start_servers(router([slow.url], *ROUTER_OPTS))
    body = {**CHAT, "max_tokens": 20, "stream": True}
    with httpx.stream("POST", lm.url + "/v1/chat/completions", json=body) as stream:
        assert stream.headers["x-lmroute-replica"] == slow.url
        httpx.post(lm.url + "/admin/replicas", json={"url": other.url}, headers=ADMIN)
        r = httpx.post(lm.url + "/admin/replicas/drain", json={"url": slow.url},
                       headers=ADMIN)
        assert {x["url"]: (x["draining"], x["in_flight"]) for x in r.json()["replicas"]} == {
            slow.url: (True, 1), other.url: (False, 0)}
        after = [httpx.post(lm.url + "/v1/chat/completions", json=CHAT) for _ in range(4)]
        assert {x.headers["x-lmroute-replica"] for x in after} == {other.url}
        text = stream.read()
    assert text.endswith(b"data: [DONE]\n\n")
    assert text.count(b'"delta":{"content"') == 20
    httpx.post(lm.url + "/admin/replicas/drain", json={"url": slow.url, "drain": False},
               headers=ADMIN)
    again = {httpx.post(lm.url + "/v1/chat/completions", json=CHAT).headers[
        "x-lmroute-replica"] for _ in range(4)}
    assert again == {slow.url, other.url}


@pytest.mark.parametrize(("given", "kept"), [
    ("http://127.0.0.1:8000/", "http://127.0.0.1:8000"),
    ("https://vllm-0.ns.svc/v1x", "https://vllm-0.ns.svc/v1x"),
    ("http://[::1]:8000", "http://[::1]:8000"), ("http://host\U0001f3fb:80", None),
    ("http://[zz]:1", None), ("http://h:99999", None), ("http://a b", None),
    ("http://h:80?x=1", None), ("ftp://h", None), ("http://user@h", None)])
def test_replica_urls_are_checked(given: str, kept: str | None) -> None:
    assert replica_url(given) == kept


def test_a_bad_url_is_a_400_and_a_bad_file_line_is_skipped(start_servers,
                                                          tmp_path: Path) -> None:
    rep = start_servers(replica())
    listed = tmp_path / "backends"
    listed.write_text(f"http://h\u00e9:1\n{rep.url}\n")
    lm = start_servers(router([], "--backends-file", str(listed), "--admin-key", "k"))
    bad = httpx.post(lm.url + "/admin/replicas", json={"url": "http://h\u00e9:1"},
                     headers={"authorization": "Bearer k"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "url"
    urls = [r["url"] for r in httpx.get(lm.url + "/admin/replicas",
                                        headers={"authorization": "Bearer k"}).json()["replicas"]]
    assert urls == [rep.url]
