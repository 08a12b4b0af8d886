"""What a reply leaves behind is recorded after the reply is sent, and never lost.

The proxy hands its bookkeeping (metrics, the policy's observation, the prefix index) to
the event loop once a reply is on its way (``router.proxy._after_reply``), so the client
does not wait for it. Whatever the client does next must already see it: the policy has
observed every reply (``locality``'s queues are empty, its calibration counted them) and
the request counter includes it, as the reply reaches the client.
"""

from __future__ import annotations

from collections.abc import Callable

import httpx
import orjson

try:
    from servers import Server, router
except ImportError:  # tests/ became a package
    from tests.servers import Server, router

KEY = "k3y"
AUTH = {"authorization": f"Bearer {KEY}"}


def _served(metrics: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
               if line.startswith("lmroute_requests_total{") and 'status="200"' in line)


def test_every_reply_is_observed_and_counted_before_the_client_can_ask(
        start_servers: Callable[[Server], Server], two_replicas: list[Server]) -> None:
    rt = start_servers(router([s.url for s in two_replicas], "--policy", "locality",
                              "--admin-key", KEY))
    with httpx.Client(timeout=30.0) as client:
        for i in range(12):
            body = {"model": "emulated-27b", "max_tokens": 4, "stream": i % 2 == 1,
                    "messages": [{"role": "user", "content": f"turn {i} " + "x" * 2000}]}
            resp = client.post(rt.url + "/v1/chat/completions", content=orjson.dumps(body),
                               headers={"content-type": "application/json",
                                        "x-session-id": f"s{i % 3}"})
            assert resp.status_code == 200
            state = client.get(rt.url + "/policy", headers=AUTH).json()
            assert sum(state["queued"].values()) == 0, state  # every first token observed
            assert state["calibration"]["observations"] == i + 1
            assert _served(client.get(rt.url + "/metrics").text) == i + 1
            # A session's next turn finds the prefix recorded where it was served.
            lookup = client.post(rt.url + "/index/lookup", headers=AUTH,
                                 json={"model": "emulated-27b", "messages": body["messages"]})
            assert lookup.status_code == 200 and max(lookup.json()["gpu"].values()) > 0, \
                lookup.text
