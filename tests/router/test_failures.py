"""router.failures: whose fault a 5xx is, and the error body the client gets; and the
adaptive index lookup timeout."""

from __future__ import annotations

import orjson
import pytest

from router.failures import classify, shaped
from router.index.resilient import LookupTimeout

JSON = "application/json"
VLLM_500 = orjson.dumps({"error": {"message": "list index out of range", "type":
                                   "InternalServerError", "param": None, "code": 500}})
FLAT = orjson.dumps({"object": "error", "message": "bad input", "type": "BadRequestError",
                     "param": None, "code": 500})
DEAD = orjson.dumps({"error": {"message": "EngineCore encountered an issue. See stack trace",
                               "type": "EngineDeadError", "param": None, "code": 500}})


@pytest.mark.parametrize(("status", "ctype", "body", "verdict"), [
    (500, JSON, VLLM_500, "request"),
    (500, JSON, FLAT, "request"),
    (500, JSON, DEAD, "replica"),
    (500, "text/plain", b"Internal Server Error", "suspect"),
    (503, "text/html", b"<html>503 Service Unavailable</html>", "replica"),
    (502, "", b"", "replica"),
    (504, JSON, VLLM_500, "request"),
    (500, JSON, None, "replica"),  # broke while being read
    (500, JSON, b"[1, 2]", "suspect"),
])
def test_classify(status: int, ctype: str, body: bytes | None, verdict: str) -> None:
    assert classify(status, ctype, body) == verdict


def test_shaped() -> None:
    assert shaped(500, JSON, VLLM_500) is None  # already OpenAI-shaped: passed through
    flat = orjson.loads(shaped(500, JSON, FLAT) or b"")
    assert flat == {"error": {"message": "bad input", "type": "BadRequestError", "param": None,
                              "code": "500"}}
    plain = orjson.loads(shaped(500, "text/plain", b"Internal Server Error") or b"")
    assert plain["error"]["message"] == "the replica answered 500: Internal Server Error"
    assert plain["error"]["code"] == "upstream_500"
    assert set(plain["error"]) == {"message", "type", "param", "code"}
    long = orjson.loads(shaped(502, "text/html", b"x" * 10_000) or b"")
    assert len(long["error"]["message"]) < 600


def test_lookup_timeout_adapts_within_bounds() -> None:
    t = LookupTimeout(0.005, 0.05)
    assert t.value_s == 0.005
    for _ in range(512):
        t.observe(0.0003)  # loopback Redis: 4 x p99 under the floor
    assert t.value_s == 0.005
    for _ in range(512):
        t.observe(0.004)  # a busy machine: the bound follows
    assert t.value_s == pytest.approx(0.016)
    for _ in range(512):
        t.observe(0.05)  # timed-out lookups count as the timeout: it grows to the ceiling
    assert t.value_s == 0.05
