"""schemathesis against the live router's own ``/openapi.json``: requests generated from
the schema (valid ones, and invalid ones: wrong types, missing fields) must never get a
5xx. The router runs with tenants and an admin key (the full gate: salting, auth, limits
off) in front of two emulated replicas with a 4,096-token context."""

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
EXAMPLES = {"POST /v1/chat/completions": 250, "POST /v1/completions": 470,
            "POST /index/lookup": 60}
GET_EXAMPLES = 150
MIN_CASES = 2000


@dataclass
class Tally:
    statuses: Counter[int] = field(default_factory=Counter)
    server_errors: list[str] = field(default_factory=list)


def _fuzz(operation: Any, mode: GenerationMode, examples: int, url: str,
          headers: dict[str, str], session: requests.Session, tally: Tally) -> None:
    @settings(max_examples=examples, deadline=None, database=None, derandomize=True,
              phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    @given(case=operation.as_strategy(generation_mode=mode))
    def run(case: schemathesis.Case) -> None:
        response = case.call(base_url=url, headers=headers, session=session, timeout=30)
        tally.statuses[response.status_code] += 1
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
        for result in schema.get_all_operations():
            operation = result.ok()
            internal = not operation.path.startswith("/v1")
            headers = {"authorization": f"Bearer {ADMIN if internal else TENANT}"}
            modes = [GenerationMode.POSITIVE]
            if operation.method.upper() == "POST":  # a GET without parameters: nothing to break
                modes.append(GenerationMode.NEGATIVE)
            for mode in modes:
                _fuzz(operation, mode, EXAMPLES.get(operation.label, GET_EXAMPLES), lm.url,
                      headers, session, tally)
    total = sum(tally.statuses.values())
    print(f"schemathesis: {total} cases, statuses {dict(sorted(tally.statuses.items()))}")
    assert not tally.server_errors, tally.server_errors[:5]
    assert total >= MIN_CASES
