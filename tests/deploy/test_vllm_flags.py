"""The GPU stack's vLLM flags (docker-compose.yml and the gpu overlay), parsed by vLLM
0.32's own `vllm serve` parser from the vLLM CPU venv (``make test-vllm``), and agreeing
with what the router is told: KV events on the port it subscribes to, LMCache as the
connector in both roles, prefix caching on, and each reply's cached tokens reported. A
flag vLLM renamed or a field its KVEventsConfig no longer takes fails here, not on a GPU
host."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

try:
    import configs
    from kustomize import render
except ImportError:  # tests/ became a package
    from tests.deploy import configs
    from tests.deploy.kustomize import render

pytestmark = pytest.mark.vllm


def _vllm_python() -> Path:
    python = Path(os.environ.get("LMROUTE_VLLM_PYTHON", configs.ROOT / ".venv-vllm/bin/python"))
    if not python.exists():
        pytest.fail(f"no vLLM venv at {python}: run `make test-vllm` (it builds .venv-vllm)")
    return python


def _parse(argvs: list[list[str]]) -> list[dict[str, Any]]:
    done = subprocess.run([str(_vllm_python()), str(Path(__file__).with_name("vllm_flags.py"))],
                          input=json.dumps(argvs), capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    parsed: list[dict[str, Any]] = json.loads(done.stdout.strip().splitlines()[-1])
    return parsed


def _gpu_argvs() -> dict[str, list[str]]:
    compose = configs.load_compose(configs.GPU_COMPOSE)["services"]
    argvs = {f"compose {n}": list(compose[n]["command"]) for n in ("vllm-a", "vllm-b")}
    for obj in render(configs.K8S / "overlays/gpu"):
        if obj["kind"] == "StatefulSet" and obj["metadata"]["name"] == "vllm":
            container = obj["spec"]["template"]["spec"]["containers"][0]
            assert container["command"] == ["vllm", "serve"]
            argvs["k8s vllm"] = list(container["args"])
    assert compose["vllm-a"]["entrypoint"] == ["vllm", "serve"]
    return argvs


def test_vllm_parses_every_gpu_command_as_the_router_expects() -> None:
    argvs = _gpu_argvs()
    assert len(argvs) == 3
    for (where, _), parsed in zip(argvs.items(), _parse(list(argvs.values())), strict=True):
        assert "error" not in parsed, (where, parsed)
        assert parsed["prefix_caching"] and parsed["port"] == 8000, where
        # usage.prompt_tokens_details.cached_tokens: what locality checks calibration with
        assert parsed["prompt_tokens_details"], where
        assert (parsed["kv_connector"], parsed["kv_role"]) == ("LMCacheConnectorV1", "kv_both")
        events = parsed["kv_events"]
        assert events["enabled"] and events["publisher"] == "zmq", where
        assert events["endpoint"] == "tcp://*:5557", where


def test_the_parser_really_refuses_what_it_does_not_know() -> None:
    """The check above means something: a renamed flag and an unknown events field fail."""
    bad_flag = ["org/model", "--enable-prefix-cache"]
    bad_field = ["org/model", '--kv-events-config={"enable_kv_cache_events":true,"topix":"x"}']
    good_field = ["org/model", '--kv-events-config={"enable_kv_cache_events":true,"topic":"x"}']
    refused, unknown, accepted = _parse([bad_flag, bad_field, good_field])
    assert "enable-prefix-cache" in refused["error"]
    assert "topix" in unknown["error"]
    assert accepted["kv_events"]["topic"] == "x"
