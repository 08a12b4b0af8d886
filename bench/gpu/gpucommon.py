"""Shared helpers of the bench/gpu scripts: device choice, timing, incremental JSON output.

Timing: on CUDA, ``torch.cuda.Event`` pairs on the stream doing the work, read after a
synchronize (device work is asynchronous, so a host clock alone would time the enqueue);
on the CPU (the ``--small`` smoke runs) a ``perf_counter`` pair. Each result is appended
to the output document and the whole document is rewritten at once, so a run killed by
its time cap still leaves every finished measurement on disk.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Any

import torch


def pick_device(force_cpu: bool) -> torch.device:
    """CUDA when present and not forced off, else the CPU (smoke runs only)."""
    if torch.cuda.is_available() and not force_cpu:
        return torch.device("cuda")
    return torch.device("cpu")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


class Timer:
    """Elapsed milliseconds between ``start()`` and ``stop()`` on ``device``'s current stream."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._t0 = 0.0
        self._t1 = 0.0
        if device.type == "cuda":
            self._e0 = torch.cuda.Event(enable_timing=True)
            self._e1 = torch.cuda.Event(enable_timing=True)

    def start(self) -> None:
        if self.device.type == "cuda":
            self._e0.record()
        self._t0 = time.perf_counter()

    def stop(self) -> None:
        if self.device.type == "cuda":
            self._e1.record()
        self._t1 = time.perf_counter()

    def ms(self) -> float:
        """Device time (CUDA events) or host time; synchronizes first."""
        sync(self.device)
        if self.device.type == "cuda":
            return float(self._e0.elapsed_time(self._e1))
        return (self._t1 - self._t0) * 1e3


def environment(device: torch.device) -> dict[str, Any]:
    """What ran: torch version, device name and memory, host."""
    env: dict[str, Any] = {"torch": torch.__version__, "device": device.type,
                           "host": platform.node(), "cpus": os.cpu_count()}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(0)
        env.update(gpu=props.name, gpu_mem_bytes=props.total_memory,
                   sms=props.multi_processor_count, cuda=torch.version.cuda)
    return env


class Results:
    """A JSON document ``{"meta": ..., "results": [...]}`` rewritten after every append."""

    def __init__(self, path: Path, meta: dict[str, Any]) -> None:
        self.path = path
        self.doc: dict[str, Any] = {"meta": meta, "results": [], "complete": False}
        self.flush()

    def add(self, row: dict[str, Any]) -> None:
        self.doc["results"].append(row)
        self.flush()
        print(json.dumps(row), flush=True)

    def finish(self, **extra: Any) -> None:
        self.doc["complete"] = True
        self.doc["meta"].update(extra)
        self.flush()

    def flush(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.doc, indent=1) + "\n", encoding="utf-8")
        tmp.replace(self.path)


def median(xs: list[float]) -> float:
    s = sorted(xs)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2
