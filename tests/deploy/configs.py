"""Read the deployment files as a user's tools would: compose files with their variables
filled from defaults, the router's settings and CLI flags, the replica's CLI flags.

``interpolate`` follows compose's rules for the forms the files use: ``${VAR:-default}``
gives the default, ``${VAR:?message}`` (a required variable) gives ``REQUIRED``, ``$$``
a literal dollar.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

import yaml

from router.cli import build_parser
from router.settings import field_help

ROOT = Path(__file__).resolve().parent.parent.parent
GPU_COMPOSE = ROOT / "docker-compose.yml"
EMULATED_COMPOSE = ROOT / "deploy" / "compose.emulated.yml"
K8S = ROOT / "deploy" / "k8s"
REQUIRED = "REQUIRED"

_VAR = re.compile(r"\$\{(\w+)(?::([-?])([^}]*))?\}|\$\$")


def interpolate(value: Any) -> Any:
    """``value`` with compose variables replaced by their defaults (see module doc)."""
    if isinstance(value, str):
        def fill(m: re.Match[str]) -> str:
            if m.group(0) == "$$":
                return "$"
            return m.group(3) if m.group(2) == "-" else REQUIRED
        return _VAR.sub(fill, value)
    if isinstance(value, list):
        return [interpolate(v) for v in value]
    if isinstance(value, dict):
        return {k: interpolate(v) for k, v in value.items()}
    return value


def load_compose(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = interpolate(yaml.safe_load(path.read_text()))
    return data


def load_k8s(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def settings_env_names() -> set[str]:
    """Every LMROUTE_* variable the router reads (its settings, and LMROUTE_CONFIG)."""
    return {"LMROUTE_" + name.upper() for name in field_help()} | {"LMROUTE_CONFIG"}


def subcommand_flags(command: str) -> set[str]:
    """Long options of ``lmroute COMMAND``, from the real parser."""
    for action in build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction) and command in action.choices:
            sub = action.choices[command]
            return {s for a in sub._actions for s in a.option_strings if s.startswith("--")}
    raise KeyError(command)


def replica_args(argv: list[str]) -> Any:
    """``lmroute replica ARGV`` parsed by the real CLI (SystemExit on a bad flag)."""
    return build_parser().parse_args(["replica", *argv])


_SUFFIXES = {"histogram": ("_bucket", "_sum", "_count")}


def exported_names(exposition: str) -> set[str]:
    """Series names a Prometheus text exposition offers, from its ``# TYPE`` lines (a
    histogram ``x`` is scraped as ``x_bucket``, ``x_sum``, ``x_count``; the client names
    counters with their ``_total``)."""
    names: set[str] = set()
    for line in exposition.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            names.update(name + s for s in _SUFFIXES.get(kind, ("",)))
    return names


def metric_words(expr: str) -> set[str]:
    """Identifiers in a PromQL expression (metric names among them)."""
    return set(re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", expr))
