"""Sessions between turns, through the router: ``locality`` parks a session on its replica
when its reply ends and learns the gap when it comes back (``policies.returning``)."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
import orjson

try:
    from servers import Server, replica, router
except ImportError:  # tests/ became a package
    from tests.servers import Server, replica, router

def _turn(url: str, session: str | None, words: int) -> None:
    body = {"model": "emulated-27b", "max_tokens": 2,
            "prompt": " ".join(f"{session}w{i}" for i in range(words))}
    headers = {"content-type": "application/json"}
    if session is not None:
        headers["x-session-id"] = session
    resp = httpx.post(url + "/v1/completions", content=orjson.dumps(body), headers=headers,
                      timeout=30)
    assert resp.status_code == 200, resp.text


def _returning(rt: Server) -> dict[str, object]:
    state: dict[str, object] = httpx.get(rt.url + "/policy").json()["returning"]
    return state


def _parked(state: dict[str, object]) -> int:
    parked = state["parked"]
    assert isinstance(parked, dict)
    return sum(parked.values())


def test_sessions_park_between_turns_and_teach_the_gap_when_they_come_back(
        start_servers: Callable[[Server], Server]) -> None:
    reps = [start_servers(replica("--profile", "study-27b", "--time-scale", "0.01"))
            for _ in range(2)]
    rt = start_servers(router([r.url for r in reps], "--policy", "locality"))

    _turn(rt.url, "alice", 400)
    _turn(rt.url, "bob", 400)
    state = _returning(rt)
    assert _parked(state) == 2 and state["gap_s"] == 0.0  # nobody came back yet

    time.sleep(0.2)
    _turn(rt.url, "alice", 500)  # alice's next turn: back after >= 0.2 s
    state = _returning(rt)
    assert _parked(state) == 2  # alice is between turns again
    assert isinstance(state["gap_s"], float) and 0.2 <= state["gap_s"] < 10.0

    # Requests without a session id (completions) are each their own session: they park
    # and never teach a gap of their own.
    _turn(rt.url, None, 300)
    assert _parked(_returning(rt)) == 3
