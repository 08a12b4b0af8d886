"""Package boundaries: what imports what, each check in a fresh interpreter."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _imported(path: Path) -> set[str]:
    """Top-level packages a module imports (anywhere in it, lazily or not)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module.split(".")[0])
    return out


def test_policies_import_neither_router_nor_sim() -> None:
    for path in sorted((ROOT / "policies").rglob("*.py")):
        assert not _imported(path) & {"router", "sim"}, path
    loaded = _run(
        "import pkgutil, sys, importlib, policies\n"
        "for m in pkgutil.walk_packages(policies.__path__, 'policies.'):\n"
        "    importlib.import_module(m.name)\n"
        "print(' '.join(sorted({n.split('.')[0] for n in sys.modules})))")
    assert not {"router", "sim"} & set(loaded.split())


def test_only_the_cli_imports_sim() -> None:
    importers = [path.relative_to(ROOT).as_posix()
                 for path in sorted((ROOT / "router").rglob("*.py")) if "sim" in _imported(path)]
    assert importers == ["router/cli.py"]


def test_a_default_router_loads_no_heavy_or_optional_package() -> None:
    loaded = _run(
        "import sys\n"
        "import router.app\n"
        "from router.settings import Settings\n"
        "router.app.create_app(Settings(backends=('http://127.0.0.1:9',)))\n"
        "print(' '.join(sorted({n.split('.')[0] for n in sys.modules})))")
    assert not {"numpy", "scipy", "matplotlib", "redis", "sim", "httpx"} & set(loaded.split())


def test_the_routers_own_commands_load_no_simulator() -> None:
    """``lmroute serve`` (and ``policies``, ``validate``) build the router's parsers only:
    the simulator's imported its experiments and scipy, a second of every start-up and
    ~85 MB in every router process."""
    loaded = _run(
        "import contextlib, io, sys\n"
        "from router import cli\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    cli.main(['policies'])\n"
        "print(' '.join(sorted({n.split('.')[0] for n in sys.modules})))")
    assert not {"sim", "scipy", "numpy"} & set(loaded.split())
    every = _run("from router import cli\n"
                 "print(' '.join(cli.build_parser()._subparsers._group_actions[0].choices))")
    assert {"serve", "sim", "ab", "demo"} <= set(every.split())


def _sim_layers(path: Path) -> set[str]:
    """The sim sub-packages a module imports (``sim.des.loop`` -> ``des``)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
        out.update(n.split(".")[1] for n in names if n.startswith("sim.") and n.count(".") >= 1)
    return out


def test_sim_depends_one_way() -> None:
    """experiments -> des / emulator -> replica: no layer imports one above or beside it."""
    allowed = {"replica": {"replica"}, "des": {"des", "replica"},
               "emulator": {"emulator", "replica"},
               "experiments": {"experiments", "des", "emulator", "replica"}}
    for layer, may in allowed.items():
        for path in sorted((ROOT / "sim" / layer).rglob("*.py")):
            assert _sim_layers(path) <= may, (path, _sim_layers(path) - may)
