"""The router image and the emulated compose stack, really run in Docker (``make test-deploy``).

A session through the router with the openai SDK: its first turn prefills on one replica
container, the next is a GPU hit there; that container is killed, and the following turn
fails over to the other container, which loads the whole history from the shared pool
(its cached tokens; its emulated TTFT is recorded next to the first turn's prefill).
Numbers land in LMROUTE_DEPLOY_REPORT (make test-deploy: out/deploy.json).
"""

from __future__ import annotations

import subprocess
import time
from typing import Any

import httpx
import openai
import pytest

try:
    from servers_redis import free_port
    from stack import IMAGE, ROOT, Stack, wait_ok
except ImportError:  # tests/ became a package
    from tests.deploy.stack import IMAGE, ROOT, Stack, wait_ok
    from tests.servers_redis import free_port

pytestmark = pytest.mark.deploy
MAX_IMAGE_BYTES = 250 * 10**6
CHUNK = 1568  # the study-27b profile's pool chunk


def _docker(*args: str, timeout: float = 120.0) -> str:
    done = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout,
                          check=False)
    assert done.returncode == 0, f"docker {args}: {done.stderr[-2000:]}"
    return done.stdout


def test_both_compose_files_pass_the_real_compose_parser() -> None:
    for path, env in ((ROOT / "docker-compose.yml", {"MODEL": "org/model"}),
                      (ROOT / "deploy" / "compose.emulated.yml", {})):
        done = subprocess.run(["docker-compose", "-f", str(path), "config", "-q"],
                              env={"PATH": "/usr/local/bin:/usr/bin:/bin", **env},
                              capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, (path, done.stderr)


def test_router_image_is_small_non_root_and_serves(report: dict[str, Any]) -> None:
    size = int(_docker("image", "inspect", "-f", "{{.Size}}", IMAGE))
    report["image_bytes"] = size
    assert size < MAX_IMAGE_BYTES
    assert _docker("run", "--rm", "--entrypoint", "id", IMAGE, "-u").strip() != "0"
    # The compiled build (the Dockerfile's COMPILED=1): the hot modules are C extensions,
    # and the compiler's packages did not come along.
    where = _docker("run", "--rm", "--entrypoint", "python", IMAGE, "-c",
                    "import importlib.util as u, policies.locality as m, router.proxy as p; "
                    "print(m.__file__, p.__file__, u.find_spec('mypy') is None)").split()
    assert where[0].endswith(".so") and where[1].endswith(".so") and where[2] == "True", where
    port = free_port()
    name = f"lmroute-start-{port}"
    started = time.monotonic()
    _docker("run", "-d", "--name", name, "--network", "host", "-e", f"LMROUTE_PORT={port}",
            "-e", "LMROUTE_HOST=127.0.0.1", "-e", "LMROUTE_BACKENDS=http://127.0.0.1:9", IMAGE)
    try:
        wait_ok(f"http://127.0.0.1:{port}/health", 60.0)
        report["router_start_s"] = round(time.monotonic() - started, 2)  # docker run -> /health
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, timeout=60, check=False)


def _turn(client: openai.OpenAI, messages: list[dict[str, str]], text: str) -> dict[str, Any]:
    """One streamed turn: replica, reason, TTFT and usage; the reply joins the history."""
    messages.append({"role": "user", "content": text})
    started = time.monotonic()
    raw = client.chat.completions.with_raw_response.create(
        model="emulated-27b", messages=messages, max_tokens=8, stream=True,  # type: ignore[arg-type]
        stream_options={"include_usage": True}, extra_headers={"X-Session-ID": "deploy-1"})
    ttft, words, usage = None, [], None
    for chunk in raw.parse():
        if chunk.choices and chunk.choices[0].delta.content:
            ttft = ttft if ttft is not None else time.monotonic() - started
            words.append(chunk.choices[0].delta.content)
        if chunk.usage is not None:
            usage = chunk.usage
    assert usage is not None and ttft is not None
    messages.append({"role": "assistant", "content": "".join(words)})
    cached = usage.prompt_tokens_details.cached_tokens if usage.prompt_tokens_details else 0
    return {"replica": raw.headers["x-lmroute-replica"], "reason": raw.headers["x-lmroute-reason"],
            "ttft_s": round(ttft, 3), "prompt_tokens": usage.prompt_tokens,
            "cached_tokens": cached}


def test_a_session_moves_to_the_other_container_through_the_shared_pool(
        stack: Stack, report: dict[str, Any]) -> None:
    client = openai.OpenAI(base_url=stack.router_url + "/v1", api_key="unused", max_retries=0)
    history = [{"role": "system", "content": "You answer briefly. " + "background " * 30000}]
    first = _turn(client, history, "first question")
    again = _turn(client, history, "second question")
    assert first["reason"] == "miss" and first["cached_tokens"] == 0
    assert again["replica"] == first["replica"] and again["cached_tokens"] > 0

    served = next(n for n, p in stack.replica_ports.items() if first["replica"].endswith(f":{p}"))
    _docker("kill", stack.container(f"replica-{served}"))
    moved = _turn(client, history, "third question")
    other = next(n for n in stack.replica_ports if n != served)
    assert moved["replica"].endswith(f":{stack.replica_ports[other]}")
    assert moved["reason"] == "failover"
    # The other container never prefilled this history: all of it came from the pool.
    assert moved["cached_tokens"] >= (first["prompt_tokens"] // CHUNK) * CHUNK > 0
    replicas = httpx.get(stack.router_url + "/replicas", timeout=10.0).json()["replicas"]
    alive = f"http://127.0.0.1:{stack.replica_ports[other]}"
    assert [r["healthy"] for r in replicas if r["url"] == alive] == [True]
    report["session"] = [first, again, moved]
