"""The build compiled by mypyc (setup.py, ``LMROUTE_MYPYC=1``, ``make fast``) decides and
answers exactly as the pure-Python source does.

mypyc enforces annotations at run time and has its own semantics in places (native
integers, attribute access, no monkeypatching, class attributes of exception classes,
functions that ``inspect`` no longer calls functions), so a compiled build could fail or
decide differently where the pure one works. Here setup.py's list of modules is compiled
once into a copy of ``policies/`` and ``router/``, and:

- the same simulations (a multi-turn workload on one router, a document workload without
  a pool on four routers, each router its own policy) run in two interpreters, one
  importing the copy and one the source: every request's replica, reason and time to
  first token must be equal, bit for bit;
- a compiled and a pure ``lmroute serve`` run side by side in front of the same two
  emulated replicas and get the same requests (answered, refused, streamed, the
  non-routed routes): every status, error body and reply must be the same.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import httpx
import pytest

try:
    from servers import Server, replica, router
except ImportError:  # tests/ became a package
    from tests.servers import Server, replica, router

ROOT = Path(__file__).resolve().parents[2]

# Runs in the interpreter under test; ``policies`` comes from its working directory.
DRIVER = """
import hashlib, json
import policies.locality as compiled
from sim.experiments.gauntlet import Job, records
rows = []
for workload, hardware, routers in (("tenants", "study-27b", 1), ("docqa", "no-pool", 4)):
    job = Job(workload, hardware, 4, routers, 1.0, "locality", 0, 150.0, "study-27b")
    rows += [(r.replica, r.reason, r.ttft_s.hex(), r.router) for r in records(job)]
print(json.dumps({"module": compiled.__file__, "n": len(rows),
                  "says": compiled.Locality().describe()["compiled"],
                  "digest": hashlib.sha256(repr(rows).encode()).hexdigest(),
                  "reasons": sorted({r[1] for r in rows})}))
"""


def compiled_modules() -> list[str]:
    """setup.py's ``COMPILED`` list, read without running setup.py."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "COMPILED" for t in node.targets):
            return list(ast.literal_eval(node.value))
    raise AssertionError("setup.py names no COMPILED modules")


def run_driver(cwd: Path) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-c", DRIVER], cwd=cwd, env=env, check=True,
                         capture_output=True, text=True, timeout=600)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of ``policies/`` and ``router/`` with setup.py's modules compiled in place."""
    assert shutil.which("cc") or shutil.which("gcc"), "mypyc needs a C compiler (apt install gcc)"
    tmp_path = tmp_path_factory.mktemp("compiled")
    for package in ("policies", "router"):
        shutil.copytree(ROOT / package, tmp_path / package,
                        ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    # The build's mypy settings (pyproject.toml's [tool.mypy]; not the file itself: this
    # venv's setuptools may predate its [project] table).
    mypy = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    (tmp_path / "mypy.ini").write_text("[mypy]\n" + "".join(
        f"{k} = {v if not isinstance(v, list) else ', '.join(v)}\n" for k, v in mypy.items()))
    modules = compiled_modules()
    assert "policies/locality.py" in modules and "router/proxy.py" in modules
    build = subprocess.run([sys.executable, "-m", "mypyc", *modules], cwd=tmp_path,
                           capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    for module in modules:  # every listed module was compiled, next to its copied source
        assert list((tmp_path / module).parent.glob(f"{Path(module).stem}.*.so")), module
    return tmp_path


def test_compiled_locality_decides_as_the_source_does(build: Path) -> None:
    compiled = run_driver(build)
    source = run_driver(ROOT)
    assert str(compiled["module"]).endswith(".so"), compiled["module"]
    assert str(source["module"]).endswith("locality.py"), source["module"]
    # GET /policy tells an operator which build routes
    assert compiled.pop("says") is True and source.pop("says") is False
    # Enough happened to tell them apart: hundreds of requests, placements of every kind.
    assert source["n"] > 300
    assert {"sticky", "miss"} <= set(source["reasons"])
    assert compiled == {**source, "module": compiled["module"]}


MODEL = "emulated-27b"
# (method, path, extra headers, JSON body or raw bytes): one of each way a request is
# answered or refused. Every prompt differs, so no reply depends on what was cached.
REQUESTS: list[tuple[str, str, dict[str, str], Any]] = [
    ("POST", "/v1/chat/completions", {}, {
        "model": MODEL, "messages": [{"role": "user", "content": "one"}], "max_tokens": 4}),
    ("POST", "/v1/chat/completions", {}, {
        "model": MODEL, "messages": [{"role": "user", "content": "two"}], "max_tokens": 5,
        "stream": True, "stream_options": {"include_usage": True}}),
    ("POST", "/v1/completions", {}, {"prompt": "three " * 40, "max_tokens": 3}),
    ("POST", "/v1/completions", {}, {"prompt": "four", "max_tokens": 6, "stream": True}),
    ("POST", "/v1/completions", {}, b"{not json"),
    ("POST", "/v1/chat/completions", {}, {"model": MODEL, "max_tokens": 2}),
    ("POST", "/v1/chat/completions", {}, {
        "model": "no-such-model", "messages": [{"role": "user", "content": "five"}]}),
    ("POST", "/v1/completions", {"x-lmroute-pin-replica": "r0"},
     {"prompt": "six", "max_tokens": 2}),
    ("POST", "/v1/completions", {"content-encoding": "br"}, {"prompt": "seven"}),
    ("GET", "/v1/models", {}, None),
    ("GET", "/no/such/route", {}, None),
    ("GET", "/health", {}, None),
    ("GET", "/ready", {}, None),
]


def _answer(resp: httpx.Response) -> tuple[int, Any]:
    """What a client can rely on: the status and the body, less what is unique per request
    (ids) or per replica (which one served)."""
    if resp.headers.get("content-type", "").startswith("text/event-stream"):
        events = [e.removeprefix(b"data: ") for e in resp.content.split(b"\n\n") if e]
        assert events[-1] == b"[DONE]"
        body: Any = [json.loads(e) for e in events[:-1]]
    else:
        body = resp.json()
    for item in body if isinstance(body, list) else [body]:
        item.pop("id", None)
        if isinstance(item.get("error"), dict):
            assert item["error"]["message"]
    return resp.status_code, body


def _compiled_extensions(pid: int, build: Path) -> set[str]:
    """The copy's compiled files that process ``pid`` has loaded."""
    maps = Path(f"/proc/{pid}/maps").read_text().splitlines()
    return {Path(line.split()[-1]).name for line in maps
            if line.endswith(".so") and str(build) in line}


def test_the_compiled_router_answers_as_the_source_does(
        build: Path, start_servers: Any) -> None:
    """Each router in front of its own two emulated replicas (replies byte-reproducible):
    the same requests, one after another, get the same answers from both."""
    answers: dict[str, list[tuple[int, Any]]] = {}
    # PYTHONSAFEPATH: ``python -m`` would put the working directory (the source) first
    compiled_env = {"PYTHONPATH": str(build), "PYTHONSAFEPATH": "1"}
    for name, env in (("source", None), ("compiled", compiled_env)):
        reps = [start_servers(replica("--fixed-created", "1700000000", "--tpot", "0.001",
                                      "--name", f"r{i}")) for i in range(2)]
        rt: Server = router([r.url for r in reps], "--policy", "locality")
        rt.env = env
        start_servers(rt)
        assert rt.proc is not None
        loaded = _compiled_extensions(rt.proc.pid, build)
        if name == "compiled":  # the router's request path and the policy, compiled
            assert any("__mypyc" in f for f in loaded), loaded
            assert {"proxy", "gate", "hotpath", "locality"} <= {f.split(".")[0] for f in loaded}
        else:
            assert not loaded
        policy = httpx.get(rt.url + "/policy").json()
        assert policy["compiled"] is (name == "compiled")
        got = []
        for method, path, headers, body in REQUESTS:
            content = body if isinstance(body, bytes) else (
                None if body is None else json.dumps(body).encode())
            if content is not None:
                headers = {"content-type": "application/json", **headers}
            resp = httpx.request(method, rt.url + path, headers=headers, content=content,
                                 timeout=30)
            if resp.status_code == 200 and path.startswith("/v1/") and method == "POST":
                assert resp.headers["x-lmroute-replica"] in ("r0", "r1")
            got.append(_answer(resp))
        metrics = httpx.get(rt.url + "/metrics").text
        # the routed requests were counted, by the same families
        got.append((0, sorted({line.split("{")[0].split(" ")[0] for line in metrics.splitlines()
                               if line.startswith("lmroute_")})))
        answers[name] = got
    statuses = [status for status, _ in answers["source"]]
    assert statuses[:10] == [200, 200, 200, 200, 400, 400, 404, 403, 415, 200], statuses
    assert answers["compiled"] == answers["source"]
