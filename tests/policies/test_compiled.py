"""The locality policy compiled by mypyc (setup.py, ``LMROUTE_MYPYC=1``) decides exactly as
the pure-Python source does.

mypyc enforces annotations at run time and has its own semantics in places (native
integers, attribute access, no monkeypatching), so a compiled build could fail or decide
differently where the pure one works. Here setup.py's list of modules is compiled into a
copy of ``policies/``, and the same simulations (a multi-turn workload on one router, a
document workload without a pool on four routers, each router its own policy) run in two
interpreters, one importing the copy and one the source: every request's replica, reason
and time to first token must be equal, bit for bit.
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


def test_compiled_locality_decides_as_the_source_does(tmp_path: Path) -> None:
    assert shutil.which("cc") or shutil.which("gcc"), "mypyc needs a C compiler (apt install gcc)"
    shutil.copytree(ROOT / "policies", tmp_path / "policies",
                    ignore=shutil.ignore_patterns("__pycache__"))
    # The build's mypy settings (pyproject.toml's [tool.mypy]; not the file itself: this
    # venv's setuptools may predate its [project] table).
    mypy = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    (tmp_path / "mypy.ini").write_text("[mypy]\n" + "".join(
        f"{k} = {v if not isinstance(v, list) else ', '.join(v)}\n" for k, v in mypy.items()))
    modules = compiled_modules()
    assert "policies/locality.py" in modules
    build = subprocess.run([sys.executable, "-m", "mypyc", *modules], cwd=tmp_path,
                           capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    for module in modules:  # every listed module was compiled, next to its copied source
        assert list((tmp_path / module).parent.glob(f"{Path(module).stem}.*.so")), module

    compiled = run_driver(tmp_path)
    source = run_driver(ROOT)
    assert str(compiled["module"]).endswith(".so"), compiled["module"]
    assert str(source["module"]).endswith("locality.py"), source["module"]
    # GET /policy tells an operator which build routes
    assert compiled.pop("says") is True and source.pop("says") is False
    # Enough happened to tell them apart: hundreds of requests, placements of every kind.
    assert source["n"] > 300
    assert {"sticky", "miss"} <= set(source["reasons"])
    assert compiled == {**source, "module": compiled["module"]}
