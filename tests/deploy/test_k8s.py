"""The Kubernetes manifests: every rendered object valid against the Kubernetes schemas
(kubernetes-validate, offline, strict: unknown fields fail), and wired to what the router
and the replicas really read."""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from typing import Any

import httpx
import kubernetes_validate
import pytest

try:
    import configs
    from kustomize import render
    from servers import Server, replica, router
except ImportError:  # tests/ became a package
    from tests.deploy import configs
    from tests.deploy.kustomize import render
    from tests.servers import Server, replica, router

K8S_VERSION = "1.32.0"
OVERLAYS = ["overlays/gpu", "overlays/emulated"]
CRDS = {"ServiceMonitor"}  # the Prometheus Operator's, outside the Kubernetes schemas


def _objects(path: str) -> dict[tuple[str, str], dict[str, Any]]:
    return {(o["kind"], o["metadata"]["name"]): o for o in render(configs.K8S / path)}


@pytest.mark.parametrize("path", [*OVERLAYS, "monitoring"])
def test_every_object_is_valid_against_the_kubernetes_schemas(path: str) -> None:
    objects = render(configs.K8S / path)
    assert objects
    for obj in objects:
        if obj["kind"] in CRDS:
            assert obj["apiVersion"] == "monitoring.coreos.com/v1"
            continue
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def _container(obj: dict[str, Any], name: str) -> dict[str, Any]:
    pod = obj["spec"]["template"]["spec"]
    found: dict[str, Any] = next(c for c in pod.get("initContainers", []) + pod["containers"]
                                 if c["name"] == name)
    return found


@pytest.mark.parametrize("path", OVERLAYS)
def test_routers_share_redis_probe_health_and_readiness_and_read_real_settings(path: str) -> None:
    objects = _objects(path)
    router = objects[("Deployment", "lmroute-router")]
    assert router["spec"]["replicas"] >= 2
    assert objects[("HorizontalPodAutoscaler", "lmroute-router")]["spec"]["minReplicas"] >= 2
    assert ("PodDisruptionBudget", "lmroute-router") in objects
    main = _container(router, "router")
    assert main["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert main["livenessProbe"]["httpGet"]["path"] == "/health"
    settings = objects[("ConfigMap", "lmroute-router")]["data"]
    lmroute = {k for k in settings if k.startswith("LMROUTE_")}
    env = {e["name"] for e in main["env"]}
    assert lmroute | {e for e in env if e.startswith("LMROUTE_")} <= configs.settings_env_names()
    assert set(settings) - lmroute == {"TOKENIZER_MODEL"}
    assert settings["LMROUTE_INDEX"].startswith("redis://redis:6379/")
    assert ("Service", "redis") in objects
    # Each backend is a pod of a StatefulSet behind a headless Service of that name.
    for url in settings["LMROUTE_BACKENDS"].split(","):
        pod, service = url.split("//")[1].split(":")[0].split(".")
        sts = objects[("StatefulSet", service)]
        assert objects[("Service", service)]["spec"]["clusterIP"] == "None"
        assert sts["spec"]["serviceName"] == service
        assert int(pod.rsplit("-", 1)[1]) < sts["spec"]["replicas"]


def test_gpu_overlay_pool_bound_kv_events_and_vllm_flags() -> None:
    objects = _objects("overlays/gpu")
    settings = objects[("ConfigMap", "lmroute-router")]["data"]
    server = _container(objects[("Deployment", "lmcache")], "lmcache-server")
    assert server["command"][0] == "/opt/venv/bin/lmcache_server"
    assert int(server["resources"]["limits"]["memory"]) == int(settings["LMROUTE_POOL_BYTES"])
    vllm = _container(objects[("StatefulSet", "vllm")], "vllm")
    assert vllm["resources"]["limits"]["nvidia.com/gpu"] == 1
    startup = vllm["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600  # a first download
    config = json.loads(next(a.split("=", 1)[1] for a in vllm["args"]
                             if a.startswith("--kv-events-config=")))
    port = config["endpoint"].rsplit(":", 1)[1]
    events = settings["LMROUTE_KV_EVENTS"].split(",")
    assert [e.rsplit(":", 1)[1] for e in events] == [port] * len(events)
    assert settings["LMROUTE_TOKENIZER"] == "/models/tokenizer" and settings["TOKENIZER_MODEL"]
    assert vllm["args"][0] == settings["TOKENIZER_MODEL"]  # one model for engines and router


def test_emulated_replicas_take_the_real_replica_flags() -> None:
    replica = _container(_objects("overlays/emulated")[("StatefulSet", "replica")], "replica")
    assert replica["command"] == ["lmroute", "replica"]
    args = configs.replica_args(replica["args"])
    assert args.pool.startswith("redis://redis:6379/") and args.port == 8000
    assert shlex.join(replica["args"])  # plain strings, as the container gets them


def test_dashboard_queries_only_metrics_a_running_router_exports(
        start_servers: Callable[[Server], Server]) -> None:
    backend = start_servers(replica())
    running = start_servers(router([backend.url]))
    exported = configs.exported_names(httpx.get(running.url + "/metrics", timeout=10.0).text)
    dashboard = _objects("monitoring")[("ConfigMap", "lmroute-dashboard")]["data"]["lmroute.json"]
    exprs = [t["expr"] for p in json.loads(dashboard)["panels"] for t in p["targets"]]
    for expr in exprs:
        names = {w for w in configs.metric_words(expr) if w.startswith("lmroute_")}
        assert names and names <= exported, (expr, names - exported)
