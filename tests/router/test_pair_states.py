"""bench/pair_states.py rebuilds, from a router's access log, what each request's engine was
doing when it arrived: the log it parses is the real router's, so a change to the access
line's format must break this test, not the benchmark's figures."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx

try:
    from servers import Server, replica, router
except ImportError:  # tests/ became a package
    from tests.servers import Server, replica, router

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from pair_states import by_policy, generating, report, requests_from_log, with_states


def _stream(url: str, prompt: str, max_tokens: int,
            first: threading.Event | None = None) -> None:
    body = {"model": "emulated-27b", "prompt": prompt, "max_tokens": max_tokens, "stream": True}
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as resp:
        assert resp.status_code == 200
        for chunk in resp.iter_bytes():
            if chunk and first is not None:
                first.set()


def test_a_request_sent_while_another_decodes_sees_it_decoding(
        start_servers: Callable[[Server], Server]) -> None:
    """One emulated replica (study profile at full time scale: a short prompt's prefill
    0.25 s, 18 ms a token): A streams 60 tokens (about 1.3 s); B is sent 0.2 s after A's
    first token reached the client, while A decodes; C after both ended. Rebuilt from the
    log: B saw A decoding, A and C saw nothing."""
    rep = start_servers(replica("--profile", "study-27b", "--time-scale", "1"))
    rt = start_servers(router([rep.url], "--policy", "locality"))
    first = threading.Event()
    a = threading.Thread(target=_stream, args=(rt.url, "alpha " * 40, 60, first))
    a.start()
    assert first.wait(30)
    time.sleep(0.2)  # past the millisecond the log's times are rounded to
    _stream(rt.url, "beta " * 40, 4)
    a.join()
    _stream(rt.url, "gamma " * 40, 4)
    # vLLM's benchmark client POSTs /tokenize through the router too: no arrival of the
    # workload, it must not count (it made every request of a set overlap one).
    tok = httpx.post(rt.url + "/tokenize", json={"model": "emulated-27b", "prompt": "delta"},
                     timeout=30)
    assert tok.status_code == 200
    time.sleep(0.2)  # the access line is written as the reply ends

    logged = requests_from_log(rt.log_lines())
    assert sorted(r["path"] for r in logged) == ["/tokenize", *["/v1/completions"] * 3]
    rows = with_states(generating(logged))
    assert len(rows) == 3
    rows.sort(key=lambda r: r["end"] - r["total_s"])
    first, second, third = rows
    for r in rows:
        assert 0 < r["ttft_s"] <= r["total_s"]
        assert r["replica"] == rows[0]["replica"] and r["reason"] in ("miss", "sticky")
    assert first["total_s"] > 1.0  # the long reply: 60 tokens
    assert (first["prefilling"], first["decoding"]) == (0, 0)
    assert (second["prefilling"], second["decoding"]) == (0, 1)
    assert (third["prefilling"], third["decoding"]) == (0, 0)


def test_the_report_gives_each_policys_mean_queue_at_arrival() -> None:
    """Two requests on one replica that overlap, and one alone on the other: the first
    arrival found nothing, the second one prefilling, the third nothing."""
    def req(replica: str, start: float, ttft: float, total: float) -> dict[str, object]:
        return {"replica": replica, "reason": "gpu-hit", "ttft_s": ttft, "total_s": total,
                "end": start + total}
    rows = with_states([req("a", 0.0, 0.5, 1.0), req("a", 0.2, 0.5, 1.0),
                        req("b", 0.3, 0.1, 0.2)])
    assert [(r["prefilling"], r["decoding"]) for r in rows] == [(0, 0), (1, 0), (0, 0)]
    text = report({"locality": rows})
    assert "at arrival, on average: 0.33 prefilling, 0.00 decoding" in text


def test_sets_left_out_and_records_of_other_routes_are_not_counted() -> None:
    """``by_policy``: a record of ``/tokenize`` overlapping a request is dropped (it would
    have shown that request arriving behind one prefilling), a record without a path
    (runs before it was kept) is kept, and ``skip_seeds`` drops a whole set."""
    def req(path: str | None, start: float) -> dict[str, object]:
        r: dict[str, object] = {"replica": "a", "reason": "gpu-hit", "ttft_s": 0.5,
                                "total_s": 1.0, "end": start + 1.0}
        if path is not None:
            r["path"] = path
        return r
    doc = {"runs": [
        {"policy": "p", "seed": 1, "per_request": [req("/tokenize", 0.0),
                                                   req("/v1/completions", 0.1)]},
        {"policy": "p", "seed": 2, "per_request": [req(None, 0.0), req(None, 0.1)]},
        {"policy": "p", "seed": 3, "per_request": [req("/v1/chat/completions", 0.0)]}]}
    rows = by_policy(doc, skip_seeds=[3])["p"]
    assert [(r["end"], r["prefilling"]) for r in rows] == [(1.1, 0), (1.0, 0), (1.1, 1)]
    assert len(by_policy(doc)["p"]) == 4
