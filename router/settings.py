"""One typed, frozen settings object, merged from defaults < config file < env < CLI.

Every field can be set four ways: its default here; a TOML or JSON config file
(``--config FILE``, keys are the field names); an environment variable ``LMROUTE_<FIELD>``
(upper case; lists comma-separated, booleans 1/0/true/false/yes/no/on/off: the coercer
of ``policies.options``, shared with policy options); a CLI option
``--field-name``. Later sources win. Values are coerced by the field's declared type, so
a wrong type fails at start-up with the field's name, never on the request path.
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_type_hints

from policies.options import OptionError, coerce
from router.prefix import DEFAULT_BLOCK_BYTES, DEFAULT_BLOCK_TOKENS

ENV_PREFIX = "LMROUTE_"


@dataclass(frozen=True, slots=True)
class Settings:
    """Router configuration. ``help`` metadata doubles as the CLI help text."""

    backends: tuple[str, ...] = field(
        default=(), metadata={"help": "replica base URL, e.g. http://127.0.0.1:8000 (repeat)"}
    )
    policy: str = field(
        default="locality", metadata={"help": "routing policy: NAME[@OPTION=VALUE...], e.g. "
                                          "locality@stay_margin=0.3, or split (see --split)"}
    )
    split: str = field(
        default="", metadata={"help": "A/B arms for --policy split: NAME=POLICY:WEIGHT,... "
                              "[,salt=S], or JSON (a TOML table); see policies/split.py"}
    )
    host: str = field(default="127.0.0.1", metadata={"help": "address to bind"})
    port: int = field(default=8080, metadata={"help": "port to bind"})
    workers: int = field(
        default=1, metadata={"help": "router processes sharing the port (router/workers.py); "
                             "share the index with --index redis://..."}
    )
    gc_freeze: bool = field(
        default=True, metadata={"help": "gc.freeze() after start-up (router/hotpath.py)"}
    )
    gc_threshold0: int = field(
        default=50_000, metadata={"help": "allocations between young GC collections "
                                  "(0: Python's default, 700)"}
    )
    max_body_bytes: int = field(
        default=32 * 1024 * 1024, metadata={"help": "request bodies over this get 413"}
    )
    max_attempts: int = field(
        default=3, metadata={"help": "replicas tried per request before 502 (failover)"}
    )
    connect_timeout_s: float = field(default=3.0, metadata={"help": "upstream connect timeout"})
    first_byte_timeout_s: float = field(
        default=900.0, metadata={"help": "upstream time to response headers (long prefills)"}
    )
    upstream_keepalive_s: float = field(
        default=4.0, metadata={"help": "idle upstream connections are closed after this; keep it "
                               "below the replicas' own keep-alive timeout (vLLM: "
                               "VLLM_HTTP_TIMEOUT_KEEP_ALIVE, 5 s by default)"}
    )
    keep_alive_s: int = field(
        default=75, metadata={"help": "idle client connections are kept this long (seconds); "
                              "above the idle timeout of the clients and load balancers in "
                              "front, so that they, not the router, close an idle connection"}
    )
    health_interval_s: float = field(default=2.0, metadata={"help": "replica /health period"})
    health_timeout_s: float = field(default=2.0, metadata={"help": "replica /health timeout"})
    eject_after: int = field(
        default=2, metadata={"help": "consecutive failed probes or requests that eject a replica"}
    )
    max_ejection_percent: float = field(
        default=50.0, metadata={"help": "most replicas (percent) request failures may eject "
                                "(at least one); failed health probes eject regardless"}
    )
    readmit_after: int = field(
        default=2, metadata={"help": "consecutive good probes that readmit an ejected replica"}
    )
    scrape_interval_s: float = field(
        default=2.0, metadata={"help": "replica /metrics scrape period (0 disables)"}
    )
    index: str = field(
        default="memory", metadata={"help": "prefix index: 'memory' or redis://host:port/db"}
    )
    index_lookup_timeout_s: float = field(
        default=0.005, metadata={"help": "least Redis lookup timeout (it adapts: 4 x the recent "
                                 "p99); past it the local index answers"}
    )
    index_lookup_timeout_max_s: float = field(
        default=0.05, metadata={"help": "most the adaptive Redis lookup timeout may grow to"}
    )
    block_bytes: int = field(
        default=DEFAULT_BLOCK_BYTES,
        metadata={"help": "text-mode prefix block size in bytes (~4 bytes per token)"}
    )
    pool_write_through: bool = field(
        default=True, metadata={"help": "a served prefix is also in the shared pool (LMCache)"}
    )
    gpu_kv_bytes: int = field(
        default=64 * 2**30, metadata={"help": "KV cache bytes per replica GPU (index capacity)"}
    )
    pool_bytes: int = field(
        default=256 * 2**30, metadata={"help": "shared pool bytes (index capacity; 0: no pool)"}
    )
    kv_bytes_per_token: int = field(
        default=32 * 1024, metadata={"help": "KV bytes per token (study: 27B, FP8 KV)"}
    )
    tokenizer: str = field(
        default="", metadata={"help": "local Hugging Face tokenizer dir: token mode (the engine's "
                              "token ids through the chat template); empty: text mode"}
    )
    block_tokens: int = field(
        default=DEFAULT_BLOCK_TOKENS,
        metadata={"help": "token-mode prefix block size in tokens (LMCache's chunk)"}
    )
    kv_events: tuple[str, ...] = field(
        default=(), metadata={"help": "vLLM KV-event publishers, comma-separated: tcp://HOST:PORT "
                              "aligned with --backend order, or BACKEND_URL=tcp://HOST:PORT; "
                              "'bind:' before the endpoint binds it (the engine connects); a "
                              "data-parallel replica's ranks joined with '+' or as a port range "
                              "tcp://HOST:5557..5560; '*=tcp://{host}:5557' (also {port}, "
                              "{port+N}) for every replica not named, joining ones included"}
    )
    kv_events_replay: tuple[str, ...] = field(
        default=(), metadata={"help": "their replay endpoints, same form (asked on a sequence gap)"}
    )
    kv_events_topic: str = field(default="", metadata={"help": "KV-event topic ('' = all)"})
    kv_events_local_media: tuple[str, ...] = field(
        default=("CPU",), metadata={"help": "event media that are the replica's own memory "
                                    "(vLLM's CPU offload), counted as its cache, not the shared "
                                    "pool; exact case; an event's 'locality' overrides"}
    )
    kv_events_max_blocks: int = field(
        default=131_072, metadata={"help": "engine blocks remembered per replica (hash -> our key)"}
    )
    served_model: str = field(
        default="", metadata={"help": "model name rooting event keys (empty: each replica's "
                              "first /v1/models id)"}
    )
    canary_rate: float = field(
        default=0.01, metadata={"help": "live canary: this fraction of routed chat/completions "
                                "replies (every 1/rate-th) is replayed from the pool and cold "
                                "and compared; 0: off (docs/validate.md)"}
    )
    canary_budget: int = field(
        default=12, metadata={"help": "canary requests per minute at most (two per canary)"}
    )
    canary_clean_to_clear: int = field(
        default=20, metadata={"help": "clean canaries in a row that clear a suspect pool"}
    )
    canary_max_tokens: int = field(default=8, metadata={"help": "K: tokens a canary compares"})
    canary_logprob_tol: float = field(
        default=0.05, metadata={"help": "largest |delta logprob| (nats) a clean canary may show"}
    )
    admin_key: str = field(
        default="", metadata={"help": "key for the admin API and the internal routes "
                              "(/replicas, /policy, /index/lookup); empty: admin API off"}
    )
    api_keys: str = field(
        default="", metadata={"help": "tenants file (TOML, [tenants.NAME] keys=[...]): every "
                              "request then needs a tenant's key; see docs/tenants.md"}
    )
    expose_replica_header: bool = field(
        default=False, metadata={"help": "x-lmroute-replica names the replica's URL "
                                 "(default: its --backend position, r0, r1, ...)"}
    )
    models_refresh_s: float = field(
        default=10.0, metadata={"help": "period of re-reading each replica's /v1/models (model "
                                "routing; 0: only when a replica joins or a LoRA changes)"}
    )
    backends_file: str = field(
        default="", metadata={"help": "file of replica URLs, one per line (# comments), re-read "
                              "when it changes; see docs/surface.md"}
    )
    backends_poll_s: float = field(
        default=1.0, metadata={"help": "how often --backends-file is checked for a change"}
    )
    dns_interval_s: float = field(
        default=5.0, metadata={"help": "how often dns+http://NAME:PORT backends are re-resolved"}
    )
    dns_hosts_file: str = field(
        default="", metadata={"help": "resolve dns+ backend names from this hosts-style file "
                              "(ADDRESS NAME... per line) instead of the system resolver"}
    )
    fanout_timeout_s: float = field(
        default=120.0, metadata={"help": "how long a route sent to every replica (LoRA, sleep) "
                                 "waits for each"}
    )
    responses_ttl_s: float = field(
        default=7 * 86400.0, metadata={"help": "how long a /v1/responses id is remembered "
                                       "(its replica, for GET/DELETE/cancel)"}
    )
    drain_grace_s: float = field(
        default=5.0, metadata={"help": "on SIGTERM, /ready is 503 at once but requests are still "
                               "served this long (the load balancer notices), then the "
                               "listener closes"}
    )
    drain_timeout_s: float = field(
        default=30.0, metadata={"help": "then in-flight requests (streams too) get this long to "
                                "finish before they are cancelled and the process exits"}
    )
    log_level: str = field(default="warning", metadata={"help": "log level (router and uvicorn)"})
    log_format: str = field(
        default="plain", metadata={"help": "log lines: 'plain' (time level logger: message) or "
                                   "'json' (one object per line)"}
    )
    access_log: bool = field(
        default=True, metadata={"help": "one access-log line per request (--no-access-log: off)"}
    )


class SettingsError(ValueError):
    """A setting has a wrong name or a value its type cannot take."""


def _coerce(name: str, typ: Any, value: Any) -> Any:
    """A raw value (string from env/CLI, or a parsed file value) as the field's type."""
    try:
        return coerce(name, typ, value)
    except OptionError as exc:
        raise SettingsError(f"setting {exc}") from None


def _fields() -> dict[str, Any]:
    hints = get_type_hints(Settings)
    return {f.name: hints[f.name] for f in dataclasses.fields(Settings)}


def read_config_file(path: str | Path) -> dict[str, Any]:
    """Read a TOML (``.toml``) or JSON config file into a flat mapping of field names."""
    p = Path(path)
    raw = p.read_bytes()
    data: Any = tomllib.loads(raw.decode()) if p.suffix == ".toml" else json.loads(raw)
    if not isinstance(data, dict):
        raise SettingsError(f"config file {p} must hold a table/object of settings")
    return {k.replace("-", "_"): v for k, v in data.items()}


def load_settings(
    cli: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    config_file: str | Path | None = None,
) -> Settings:
    """Merge the four sources; ``cli`` values of ``None`` mean "not given"."""
    types = _fields()
    merged: dict[str, Any] = {}
    if config_file:
        for key, value in read_config_file(config_file).items():
            if key not in types:
                raise SettingsError(f"unknown setting {key!r} in {config_file}")
            merged[key] = _coerce(key, types[key], value)
    for key, value in (env or {}).items():
        if not key.startswith(ENV_PREFIX) or key == ENV_PREFIX + "CONFIG":
            continue
        name = key[len(ENV_PREFIX) :].lower()
        if name in types:
            merged[name] = _coerce(name, types[name], value)
    for key, value in (cli or {}).items():
        if value is None or key not in types:
            continue
        if isinstance(value, list | tuple) and not value:
            continue
        merged[key] = _coerce(key, types[key], value)
    return Settings(**merged)


def field_help() -> dict[str, tuple[Any, Any, str]]:
    """name -> (type, default, help) for building the CLI."""
    types = _fields()
    return {
        f.name: (types[f.name], f.default, str(f.metadata.get("help", "")))
        for f in dataclasses.fields(Settings)
    }
