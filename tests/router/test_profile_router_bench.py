"""bench/profile_router.py's summaries (docs/benchmarks.md reads them): py-spy's native
stacks by layer, ``perf stat`` counts per request, each thread's context switches."""

from __future__ import annotations

import os
import re
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import profile_router

LOOP = "root;Runner.run (asyncio/runners.py:118)"
RAW = "\n".join([
    # uvicorn writing a response head: its socket write
    f"{LOOP};RequestResponseCycle.send (uvicorn/protocols/http/httptools_impl.py:522);"
    "uv_try_write (stream.c:1);__GI___libc_write (libc.so.6) 3",
    # uvicorn's own Python
    f"{LOOP};HttpToolsProtocol.on_header (uvicorn/protocols/http/httptools_impl.py:247) 1",
    # compiled code under uvicorn's task: the compiled frame, not uvicorn, runs it
    f"{LOOP};RequestResponseCycle.run_asgi (uvicorn/protocols/http/httptools_impl.py:420);"
    "CPyDef_proxy___Proxy____dispatch (x.so);PyDict_GetItem (libpython3.11.so) 4",
    # the loop itself, and asyncio's Python
    f"{LOOP};uv__io_poll (core.c:1);epoll_wait (libc.so.6) 2",
    f"{LOOP};Event.wait (asyncio/locks.py:210) 2",
    "",
])


def test_layers_attribute_each_sample_to_the_innermost_python_or_compiled_frame() -> None:
    text = profile_router.layers(RAW)
    assert "samples: 12" in text
    shares = {m[2]: float(m[1]) for m in re.finditer(r"^\s+([\d.]+)%\s+(.+)$", text, re.M)}
    assert shares["compiled (router, policies)"] == 33.3
    assert shares["uvicorn"] == 33.3
    assert shares["event loop (uvloop)"] == 16.7
    assert shares["asyncio"] == 16.7
    assert shares["its socket writes"] == 25.0
    assert shares["its Python and the C it calls"] == 8.3


def test_syscall_summary_is_per_request_with_switches_and_wakes() -> None:
    stat = "\n".join(["# started", "", "2000,,syscalls:sys_enter_write,100.00,,",
                      "1000,,syscalls:sys_enter_read,100.00,,",
                      "0,,syscalls:sys_enter_close,100.00,,",
                      "250,,context-switches,100.00,,", "500,,sched:sched_waking,100.00,,"])
    text = profile_router.syscall_summary(stat, requests=100)
    lines = text.splitlines()
    assert lines[0] == "context switches per request: 2.50"
    assert lines[1] == "sleeping tasks woken per request: 5.00"
    assert lines[2].startswith("system calls per request: 30.00 (3000 over 100 requests)")
    assert [line.split() for line in lines[3:]] == [["20.00", "write"], ["10.00", "read"]]


def test_thread_switches_name_every_thread_and_count_per_request() -> None:
    release = threading.Event()
    worker = threading.Thread(target=release.wait, name="sleeper")
    worker.start()
    try:
        before = profile_router.thread_switches(os.getpid())
        assert len(before) >= 2  # this thread and the sleeper
        assert all(v >= 0 and i >= 0 for v, i in before.values())
        after = {t: (v + 10, i) for t, (v, i) in before.items()}
        rows = profile_router.switches_summary(before, after, requests=5).splitlines()[1:]
        assert len(rows) == len(before)
        assert all(row.split()[:2] == ["2.000", "0.000"] for row in rows)
    finally:
        release.set()
        worker.join()
