"""schemathesis against the live router's own ``/openapi.json``: requests generated from
the schema (valid ones, and invalid ones: wrong types, missing fields) must never get a
5xx, and every error the router or a replica makes is OpenAI-shaped. The document lists
every route the router serves (tests/router/test_openapi.py): chat and completions, the
pass-through routes (their bodies loose, the replica judging them), the fan-out routes
and the admin API. The router runs with tenants and an admin key (the full gate: salting,
auth, limits off) in front of two emulated replicas with a 4,096-token context.

``POST /admin/replicas`` gets invalid bodies only, and last: a valid one adds a replica
at a generated URL, which would then (rightly) turn every fan-out into a 502. Each
operation gets the key its security scheme names (the tenant's or the admin's).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode
from servers import Server, replica, router

ADMIN = "admin-secret"
TENANT = "sk-fuzz"
# Examples per operation and mode (valid, then invalid bodies). Generating a chat body
# costs hypothesis ~50 ms, a completions body ~20 ms, a bare GET ~4 ms on a 2-core box:
# the split keeps the run near a minute. /health, /ready, /metrics take no input and
# yield one case each.
# The pass-through routes' loose bodies are cheap and mostly end at the replica's 400:
# fewer examples each.
EXAMPLES = {"POST /v1/chat/completions": 250, "POST /v1/completions": 470,
            "POST /index/lookup": 60}
GET_EXAMPLES = 150
OTHER_EXAMPLES = 40
NEGATIVE_ONLY = {"POST /admin/replicas"}
MIN_CASES = 3000
OWN_GETS = {"/v1/models", "/health", "/ready", "/metrics", "/replicas", "/policy"}


@dataclass
class Tally:
    statuses: Counter[int] = field(default_factory=Counter)
    server_errors: list[str] = field(default_factory=list)
    misshapen: list[str] = field(default_factory=list)
    operations: set[str] = field(default_factory=set)


def openai_shaped(response: requests.Response) -> bool:
    """An error body ``{"error": {"message", "type", ...}}``; a fan-out's per-replica list
    (router/fanout.py) is its own shape, as is a body that is not JSON (a replica's)."""
    if "json" not in response.headers.get("content-type", ""):
        return True
    body = response.json()
    if isinstance(body, dict) and body.get("object") == "list" and "data" in body:
        return True
    error = body.get("error") if isinstance(body, dict) else None
    return isinstance(error, dict) and isinstance(error.get("message"), str) \
        and isinstance(error.get("type"), str)


def _fuzz(operation: Any, mode: GenerationMode, examples: int, url: str,
          headers: dict[str, str], session: requests.Session, tally: Tally) -> None:
    @settings(max_examples=examples, deadline=None, database=None, derandomize=True,
              phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    @given(case=operation.as_strategy(generation_mode=mode))
    def run(case: schemathesis.Case) -> None:
        response = case.call(base_url=url, headers=headers, session=session, timeout=30)
        tally.statuses[response.status_code] += 1
        tally.operations.add(operation.label)
        if response.status_code >= 400 and not openai_shaped(response):
            tally.misshapen.append(f"{operation.label} {case.body!r:.200} -> "
                                   f"{response.status_code} {response.text[:200]}")
        if response.status_code >= 500:
            tally.server_errors.append(f"{operation.label} {case.body!r:.300} -> "
                                       f"{response.status_code} {response.text[:300]}")

    run()


def test_no_generated_request_gets_a_5xx(start_servers: Callable[[Server], Server],
                                         tmp_path: Path) -> None:
    keys = tmp_path / "tenants.toml"
    keys.write_text(f'[tenants.fuzz]\nkeys = ["{TENANT}"]\n')
    reps = [start_servers(replica("--max-model-len", "4096")) for _ in range(2)]
    lm = start_servers(router([r.url for r in reps], "--api-keys", str(keys),
                              "--admin-key", ADMIN, "--max-body-bytes", "262144"))
    schema = schemathesis.openapi.from_url(lm.url + "/openapi.json")
    tally = Tally()
    with requests.Session() as session:
        operations = [result.ok() for result in schema.get_all_operations()]
        operations.sort(key=lambda op: op.label in NEGATIVE_ONLY)  # stable: those last
        for operation in operations:
            security = operation.definition.raw.get("security") or [{}]
            headers = {"authorization": f"Bearer {TENANT if 'tenantKey' in security[0] else ADMIN}"}
            modes = [] if operation.label in NEGATIVE_ONLY else [GenerationMode.POSITIVE]
            if operation.method.upper() != "GET" or "{" in operation.path:
                modes.append(GenerationMode.NEGATIVE)  # a bare GET: nothing to break
            default = GET_EXAMPLES if operation.path in OWN_GETS else OTHER_EXAMPLES
            for mode in modes:
                _fuzz(operation, mode, EXAMPLES.get(operation.label, default), lm.url,
                      headers, session, tally)
    total = sum(tally.statuses.values())
    print(f"schemathesis: {total} cases, statuses {dict(sorted(tally.statuses.items()))}")
    assert not tally.server_errors, tally.server_errors[:5]
    assert not tally.misshapen, tally.misshapen[:5]
    assert total >= MIN_CASES
    assert {"POST /v1/embeddings", "POST /v1/audio/transcriptions", "DELETE /admin/replicas",
            "GET /v1/responses/{response_id}", "POST /v1/load_lora_adapter"} <= tally.operations
