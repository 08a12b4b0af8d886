"""Routers that do not share placements agree where a new document goes.

Two ``lmroute serve`` processes, each with its own embedded index, in front of the same
two emulated replicas: one reader of a document reaches the first router, another reader
(another session) the second. Neither router has seen the document, so every candidate
scores the same and the tie decides. ``locality`` breaks the tie of a prompt no
candidate holds by the prompt's anchor (the key of its first 16,384 tokens, computed by
the router from the body as the index's blocks are): both routers pick the same replica,
and the document is computed once. Broken by the session (``anchored=false``, with
``new_balance_s=0``: the session's hash order), the two
readers of some documents go to different replicas.
"""

from __future__ import annotations

from collections.abc import Callable

import httpx
import orjson

try:
    from servers import Server, router
except ImportError:  # tests/ became a package
    from tests.servers import Server, router

# The replicas' ids carry their random ports, so each run hashes the documents anew: with
# 8, all on one replica (or, unanchored, no document split) came once in 128 (256) runs,
# and did in CI. With 16 it is once in 32,768 (65,536).
DOCUMENTS = 16


def _replica_of(client: httpx.Client, url: str, document: int, session: str) -> str:
    text = " ".join(f"document {document} line {i}: the terms of clause {i * 7 + document}."
                    for i in range(1600))  # ~75 kB: past the anchor's 16,384 tokens
    body = {"model": "emulated-27b", "max_tokens": 4,
            "messages": [{"role": "system", "content": text},
                         {"role": "user", "content": f"{session} asks about clause 3"}]}
    resp = client.post(url + "/v1/chat/completions", content=orjson.dumps(body),
                       headers={"content-type": "application/json", "x-session-id": session})
    assert resp.status_code == 200, resp.text
    return resp.headers["x-lmroute-replica"]


def _placements(start_servers: Callable[[Server], Server], backends: list[str],
                policy: str) -> list[tuple[str, str]]:
    first = start_servers(router(backends, "--policy", policy))
    second = start_servers(router(backends, "--policy", policy))
    with httpx.Client(timeout=30.0) as client:
        return [(_replica_of(client, first.url, d, f"reader-a{d}"),
                 _replica_of(client, second.url, d, f"reader-b{d}"))
                for d in range(DOCUMENTS)]


def test_two_routers_send_a_new_documents_readers_to_one_replica(
        start_servers: Callable[[Server], Server], two_replicas: list[Server]) -> None:
    backends = [s.url for s in two_replicas]
    anchored = _placements(start_servers, backends, "locality")
    assert all(a == b for a, b in anchored), anchored
    assert len({a for a, _ in anchored}) == 2, anchored  # documents still spread
    # Broken by the session's hash (without the anchor, a prompt nobody holds would go to
    # the replica each router sent the least work lately: these two routers saw the same
    # requests in the same order, so they would agree by that alone).
    by_session = _placements(start_servers, backends,
                             "locality@anchored=false@new_balance_s=0")
    assert any(a != b for a, b in by_session), by_session
