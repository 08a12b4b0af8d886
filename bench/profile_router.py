"""Profile ``lmroute serve`` under wrk load with py-spy; print a text summary.

Layout as ``peers.py``: the router on core 0, two fast backends and wrk on core 1. py-spy
(``--peers-venv``'s, ``make bench-peers`` installs it) samples the router for
``--duration`` seconds of ``wrk -t2 -c64`` (``--mode stream|non-stream``, or ``paced``:
backends that send ``--events`` events ``--delay-ms`` apart). The summary groups the
samples by where the time goes (package of the innermost frame outside the standard
library, else the stdlib module) and lists the top functions by self and total time;
``--native`` (py-spy's native stacks) gives instead the share by layer: compiled code,
uvicorn (its socket writes apart), the event loop, the rest (``layers``).
``--perf``: Linux ``perf record`` instead of py-spy, for what py-spy cannot see: the
kernel's share (system calls, loopback TCP) and native code (uvloop, the interpreter);
the summary is ``perf report``'s split by object and its top symbols; ``--call-graph fp``
records call chains too and adds, for each symbol over 3 % of the samples, the chains
that called it (frame pointers: whole in the kernel, cut short in libpython and compiled
code); ``--call-graph dwarf`` unwinds user space too and lists each compiled function's
inclusive share instead (``perf report --children``): what the router's own code costs,
callees in libpython included.
``--syscalls``: count the router's system calls (``perf stat`` on the kernel's
``syscalls:sys_enter_*`` tracepoints, which cost the router no sampling) and print them
per request, and each thread's voluntary and involuntary context switches (from
``/proc``: which thread sleeps, and how often). ``--peer sglang-router|vllm-router``: the
same for that Rust router (``cache_aware``, from ``--peers-venv``) instead of lmroute, for
a like-for-like count.

    .venv/bin/python bench/profile_router.py --mode non-stream --out docs/profiles/x.txt
        [--lmroute-exe /path/to/other/checkout/.venv/bin/lmroute]
"""

from __future__ import annotations

import argparse
import collections
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

from peers import LOAD_CPU, ROUTER_CPU, tree_cpu_s
from upstream_clients import BODY, HOST, LUA_TEMPLATE, check_replies, free_port, run_wrk, started

HERE = Path(__file__).resolve().parent


def group_of(frame: str) -> str:
    """``func (package/module.py:12)`` -> its top-level package (py-spy prints paths
    relative to sys.path), ``<frozen os>`` as is."""
    path = frame.rsplit("(", 1)[-1].rstrip(")")
    if path.startswith("<"):
        return path.split(":")[0]
    return path.split("/")[0] if "/" in path else path.split(":")[0]


def stacks(raw: str) -> Iterator[tuple[list[str], int]]:
    """py-spy's raw output (``frame;frame;... count`` a line, outermost first) -> each
    stack's frames and its sample count."""
    for line in raw.splitlines():
        stack, _, n = line.rpartition(" ")
        if stack:
            yield stack.split(";"), int(n)


def summarise(raw: str, top: int = 25) -> str:
    total = 0
    by_group: collections.Counter[str] = collections.Counter()
    self_fn: collections.Counter[str] = collections.Counter()
    incl_fn: collections.Counter[str] = collections.Counter()
    incl_group: collections.Counter[str] = collections.Counter()
    for stack, count in stacks(raw):
        frames = stack[1:]  # drop the thread/process root
        total += count
        if not frames:
            continue
        self_fn[frames[-1]] += count
        by_group[group_of(frames[-1])] += count
        for f in set(frames):
            incl_fn[f] += count
        for g in {group_of(f) for f in frames}:
            incl_group[g] += count
    out = [f"samples: {total}", "", "self time by package (innermost frame):"]
    out += [f"  {100 * n / total:5.1f}%  {g}" for g, n in by_group.most_common(20)]
    out += ["", "total time by package (any frame on the stack):"]
    out += [f"  {100 * n / total:5.1f}%  {g}" for g, n in incl_group.most_common(20)]
    out += ["", f"top {top} functions by self time:"]
    out += [f"  {100 * n / total:5.1f}%  {f}" for f, n in self_fn.most_common(top)]
    mine = [(f, n) for f, n in self_fn.most_common() if group_of(f) in ("router", "policies")]
    out += ["", f"top {top} router/policies functions by self time:"]
    out += [f"  {100 * n / total:5.1f}%  {f}" for f, n in mine[:top]]
    out += ["", f"top {top} functions by total time:"]
    out += [f"  {100 * n / total:5.1f}%  {f}" for f, n in incl_fn.most_common(top)]
    mine = [(f, n) for f, n in incl_fn.most_common() if group_of(f) in ("router", "policies")]
    out += ["", f"top {2 * top} router/policies functions by total time:"]
    out += [f"  {100 * n / total:5.1f}%  {f}" for f, n in mine[:2 * top]]
    return "\n".join(out)


def _is_compiled(frame: str) -> bool:
    """A frame of mypyc-compiled code (``make fast``): its C functions' names."""
    return frame.startswith(("CPyDef_", "CPyPy_"))


def layers(raw: str) -> str:
    """``py-spy --native`` stacks -> the share of samples by the layer that runs them: the
    innermost frame that is Python or compiled (mypyc) code decides; below it, native
    frames (C libraries, system calls) count to it. uvicorn's share is split into what
    its socket writes cost (a ``write`` frame below it, which any server would make) and
    the rest: its Python and the C it calls (httptools parsing the client's request)."""
    total = 0
    by: collections.Counter[str] = collections.Counter()
    uvicorn: collections.Counter[str] = collections.Counter()
    for frames, count in stacks(raw):
        total += count
        layer, below = "native only", frames
        for i in range(len(frames) - 1, -1, -1):
            if _is_compiled(frames[i]):
                layer = "compiled (router, policies)"
                break
            if ".py:" in frames[i]:
                # uvloop is C: what runs under asyncio's Runner and no Python or compiled
                # frame is the loop itself (polling, the reads it makes, task steps)
                layer = ("event loop (uvloop)" if frames[i].startswith("Runner.run ")
                         else group_of(frames[i]))
                below = frames[i + 1:]
                break
        by[layer] += count
        if layer == "uvicorn":
            uvicorn["its socket writes" if any("write" in f for f in below)
                    else "its Python and the C it calls"] += count
    out = [f"samples: {total}", "", "share by layer (innermost Python or compiled frame):"]
    out += [f"  {100 * n / total:5.1f}%  {g}" for g, n in by.most_common(12)]
    out += ["", "uvicorn's share, split:"]
    out += [f"  {100 * n / total:5.1f}%  {g}" for g, n in uvicorn.most_common()]
    return "\n".join(out)


def _perf_report(data: Path, *options: str) -> list[str]:
    """``perf report --stdio`` on ``data`` with ``options``: its lines, comments and blank
    lines left out."""
    report = subprocess.run(["perf", "report", "-i", str(data), "--stdio", *options],
                            capture_output=True, text=True, check=True).stdout
    return [line for line in report.splitlines() if line.strip() and not line.startswith("#")]


def perf_summary(data: Path, top: int = 30, chains: str | None = None) -> str:
    """``perf report``'s share of samples by object (kernel, libpython, uvloop, ...) and
    its top symbols. ``chains="fp"`` (``perf record --call-graph fp``): the call chains into
    each symbol over 3 % of the samples, from it out to its callers (a Rust router's
    user-space frames have no frame pointers; its kernel frames still show).
    ``chains="dwarf"``: the inclusive share of each compiled (mypyc) function."""
    out = []
    for sort, n in (("dso", 15), ("dso,sym", top)):
        rows = _perf_report(data, "--no-children", "--sort", sort, "--percent-limit", "0.3",
                            "-g", "none")
        out += [f"perf report --sort {sort} (top {n}):", *rows[:n], ""]
    if chains == "fp":
        rows = _perf_report(data, "--no-children", "--sort", "sym", "-g", "graph,0.5,callee",
                            "--percent-limit", "3")
        out += ["perf report --sort sym -g graph,0.5,callee (symbols over 3 %, each with the "
                "chains that called it, innermost first):", *rows, ""]
    elif chains == "dwarf":
        rows = [line for line in _perf_report(data, "--children", "--sort", "sym", "-g", "none",
                                              "--percent-limit", "0.3") if "CPyDef_" in line]
        out += ["perf report --children: compiled functions over 0.3 %, with what they call "
                "(children, self, symbol):", *rows[:2 * top], ""]
    return "\n".join(out)


def thread_switches(pid: int) -> dict[str, tuple[int, int]]:
    """Each thread of ``pid`` ("tid name") -> its (voluntary, involuntary) context switches
    so far, from ``/proc``."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            status = (task / "status").read_text().splitlines()
            name = (task / "comm").read_text().strip()
        except OSError:  # the thread ended meanwhile
            continue
        counts = {k: int(v) for k, _, v in (line.partition(":\t") for line in status)
                  if k in ("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")}
        out[f"{task.name} {name}"] = (counts["voluntary_ctxt_switches"],
                                      counts["nonvoluntary_ctxt_switches"])
    return out


def switches_summary(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]],
                     requests: float) -> str:
    """Per request, each thread's context switches between two ``thread_switches``."""
    rows = ["context switches per request by thread (voluntary, involuntary):"]
    for thread, (vol, invol) in after.items():
        vol0, invol0 = before.get(thread, (0, 0))
        rows.append(f"  {(vol - vol0) / requests:8.3f} {(invol - invol0) / requests:8.3f}"
                    f"  {thread}")
    return "\n".join(rows) + "\n"


def syscall_summary(stat: str, requests: float) -> str:
    """``perf stat -x,``'s counts -> system calls per request, most frequent first, with the
    router's context switches and the sleeping tasks it woke (``sched:sched_waking`` fires
    in the waker, only for a task that was asleep: a write to a peer that is not yet
    reading wakes it, one to a peer already awake does not)."""
    rows, switches, wakes = [], 0, 0
    for line in stat.splitlines():
        parts = line.split(",")
        if len(parts) > 2 and parts[0].isdigit():
            if parts[2].startswith("syscalls:sys_enter_"):
                rows.append((int(parts[0]), parts[2].removeprefix("syscalls:sys_enter_")))
            elif parts[2] == "context-switches":
                switches = int(parts[0])
            elif parts[2] == "sched:sched_waking":
                wakes = int(parts[0])
    rows.sort(reverse=True)
    total = sum(n for n, _ in rows)
    out = [f"context switches per request: {switches / max(1, requests):.2f}",
           f"sleeping tasks woken per request: {wakes / max(1, requests):.2f}",
           f"system calls per request: {total / max(1, requests):.2f} "
           f"({total} over {requests:.0f} requests)"]
    out += [f"  {n / max(1, requests):8.2f}  {name}" for n, name in rows if n]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peers-venv", default=".venv-peers")
    ap.add_argument("--policy", default="round_robin")
    ap.add_argument("--mode", choices=("non-stream", "stream", "paced"), default="non-stream")
    ap.add_argument("--events", type=int, default=16)
    ap.add_argument("--delay-ms", type=float, default=10.0)
    ap.add_argument("--duration", type=int, default=12)
    ap.add_argument("--rate", type=int, default=250, help="py-spy samples/s")
    ap.add_argument("--lmroute-args", nargs="*", default=["--no-access-log"])
    ap.add_argument("--lmroute-exe", help="another checkout's lmroute (e.g. main's "
                    ".venv/bin/lmroute): its profile, for before/after")
    ap.add_argument("--perf", action="store_true",
                    help="sample with Linux perf (kernel + native) instead of py-spy")
    ap.add_argument("--call-graph", choices=("fp", "dwarf"),
                    help="with --perf: record call chains; fp (frame pointers) adds the chains "
                         "into each symbol over 3 %% of the samples, dwarf (user space unwound "
                         "too) each compiled function's inclusive share")
    ap.add_argument("--native", action="store_true",
                    help="py-spy --native: stacks through C and compiled code; the summary "
                         "is the share by layer (compiled code, uvicorn, the event loop)")
    ap.add_argument("--perf-data", type=Path,
                    help="with --perf: keep perf's data file here, for perf report")
    ap.add_argument("--syscalls", action="store_true",
                    help="count system calls per request (perf stat) instead of sampling")
    ap.add_argument("--peer", choices=("sglang-router", "vllm-router"),
                    help="run this Rust router (cache_aware) instead of lmroute")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    py = sys.executable
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        lua = Path(tmp) / "req.lua"
        lua.write_text(LUA_TEMPLATE % (BODY % ("" if args.mode == "non-stream" else ',"stream":true')))
        backends = [free_port(), free_port()]
        paced = args.mode == "paced"
        for port in backends:
            stack.enter_context(started(
                ["taskset", "-c", LOAD_CPU, py, str(HERE / "fake_backend.py"), "--host", HOST,
                 "--port", str(port), "--tokens", str(args.events if paced else 16),
                 "--token-delay", str(args.delay_ms / 1000 if paced else 0)], port, "backend"))
        port = free_port()
        exe = [args.lmroute_exe] if args.lmroute_exe else [py, "-m", "router.cli"]
        urls = [f"http://{HOST}:{b}" for b in backends]
        cmd = ["taskset", "-c", ROUTER_CPU, *exe, "serve",
               *[a for u in urls for a in ("--backend", u)],
               "--policy", args.policy, "--host", HOST, "--port", str(port), "--drain-grace-s", "0",
               *args.lmroute_args]
        if args.peer:
            cmd = ["taskset", "-c", ROUTER_CPU, str(Path(args.peers_venv) / "bin" / args.peer),
                   *(["launch"] if args.peer == "sglang-router" else []), "--host", HOST,
                   "--port", str(port), "--worker-urls", *urls, "--policy", "cache_aware",
                   "--log-level", "error", "--prometheus-port", str(free_port()),
                   "--prometheus-host", HOST]
        proc = stack.enter_context(started(cmd, port, args.peer or "lmroute"))
        if not paced:
            check_replies(port, "lmroute")
        run_wrk(port, lua, cpu=LOAD_CPU, threads=2, conns=64, duration_s=2)
        raw = Path(tmp) / "raw.txt"
        if args.syscalls:
            sampler = subprocess.Popen(["perf", "stat", "-x,", "-o", str(raw), "-e",
                                        "syscalls:sys_enter_*,context-switches,sched:sched_waking",
                                        "-p", str(proc.pid), "--", "sleep", str(args.duration)],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        elif args.perf:
            sampler = subprocess.Popen(["perf", "record", "-F", str(args.rate), "-o", str(raw),
                                        *(["--call-graph", "dwarf,16384" if args.call_graph == "dwarf"
                                          else "fp"] if args.call_graph else []),
                                        "-p", str(proc.pid), "--", "sleep", str(args.duration)],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        else:
            spy_exe = str(Path(args.peers_venv) / "bin" / "py-spy")
            sampler = subprocess.Popen([spy_exe, "record", "--format", "raw", "-o", str(raw),
                                        "-r", str(args.rate), "-d", str(args.duration),
                                        "-p", str(proc.pid),
                                        "--native" if args.native else "--nonblocking"],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.5)
        switches0 = thread_switches(proc.pid)
        cpu0 = tree_cpu_s(proc.pid)
        stats, _ = run_wrk(port, lua, cpu=LOAD_CPU, threads=2, conns=64, duration_s=args.duration - 1)
        cpu = tree_cpu_s(proc.pid) - cpu0
        switches = thread_switches(proc.pid)
        sampler.wait(timeout=60)
        if args.syscalls:
            text = (syscall_summary(raw.read_text(), stats["requests"]).rstrip("\n") + "\n\n"
                    + switches_summary(switches0, switches, stats["requests"]))
        else:
            text = perf_summary(raw, chains=args.call_graph) if args.perf else raw.read_text()
            if args.perf and args.perf_data:
                shutil.copyfile(raw, args.perf_data)
        if not (args.perf or args.syscalls):
            Path("out").mkdir(exist_ok=True)
            Path("out", args.out.stem + ".raw").write_text(text)  # for flame graphs
    per_req = cpu / max(1, stats["requests"]) * 1e6
    who = args.lmroute_exe or "this checkout"
    what = (f"{args.peer} cache_aware" if args.peer else
            f"{who}: lmroute serve --policy {args.policy} {' '.join(args.lmroute_args)}")
    sampled = ("perf stat" if args.syscalls else
               f"{'perf' if args.perf else 'py-spy'} {args.rate}/s")
    head = (f"{what}; "
            f"mode {args.mode}; "
            f"wrk -t2 -c64: {stats['rps']:.0f} req/s, router CPU {per_req:.0f}"
            f" us/request; {sampled}\n")
    summary = head + (text if args.perf or args.syscalls
                      else layers(text) if args.native else summarise(text))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(summary + "\n")
    print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
