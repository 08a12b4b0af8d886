"""Tenants: who may call the router, their cache salt, and their concurrency and rate limits.

File (``--api-keys FILE``, TOML)::

    [tenants.acme]
    keys = ["sk-acme-1", "sk-acme-2"]   # required, at least one; unique across tenants
    max_concurrency = 8                 # optional: requests in flight at once
    requests_per_minute = 600           # optional: token bucket, below
    cache_group = "docs"                # optional: tenants naming one group share a cache

Keys are kept only as SHA-256 digests (a key is looked up by the digest of what the client
sent, so neither memory nor logs hold a key in clear; ``mask`` shows its first 6 characters
for operators).

Cache salt. Each tenant's salt is ``lmt-`` + the first 32 hex digits of
``sha256("lmroute-cache-salt-v1\\0" + scope)``, ``scope`` being ``group:NAME`` for a
``cache_group`` and ``tenant:NAME`` otherwise, so two tenants share a salt only by naming
the same group. A client's own ``cache_salt`` is combined with it, never replaces it:
``combine(tenant, client)`` hashes both, so no client value reproduces another tenant's
salt. The router puts the result into the body it forwards (vLLM's ``cache_salt``, which
vLLM folds into the first block's hash) and the router's block keys are rooted in it
(``router.prefix.root_key``), so neither the engines nor the index share a prefix across
tenants. A client cannot bypass this, as the router rewrites the field on every request.

Limits. ``max_concurrency``: a request over it is refused at once (429, ``Retry-After: 1``)
rather than queued: the client's SDK backs off and retries. ``requests_per_minute``: a
token bucket of capacity ``requests_per_minute`` refilled at ``requests_per_minute / 60``
per second (a full minute's allowance may come as one burst); an empty bucket answers 429
with ``Retry-After`` = seconds until the next token, rounded up.
"""

from __future__ import annotations

import hashlib
import math
import time
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from router.errors import RateLimited

_SALT_DOMAIN = b"lmroute-cache-salt-v1\x00"
_TENANT_KEYS = {"keys", "max_concurrency", "requests_per_minute", "cache_group"}


class TenantFileError(ValueError):
    """The tenants file is malformed; the message names the tenant and key."""


def key_digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def mask(key: str) -> str:
    """A key as it may appear in logs and errors: its first 6 characters."""
    return key[:6] + "..." if len(key) > 6 else "..."


def _salt(scope: str) -> str:
    return "lmt-" + hashlib.sha256(_SALT_DOMAIN + scope.encode()).hexdigest()[:32]


def combine(tenant_salt: str, client_salt: str | None) -> str:
    """The salt sent to vLLM and rooting the block keys: the tenant's, or both hashed."""
    if not client_salt:
        return tenant_salt
    return _salt(f"combined:{len(tenant_salt)}:{tenant_salt}:{client_salt}")


@dataclass(frozen=True, slots=True)
class Tenant:
    name: str
    salt: str
    max_concurrency: int | None = None
    requests_per_minute: int | None = None


@dataclass(slots=True)
class _State:
    in_flight: int = 0
    tokens: float = 0.0
    at: float = 0.0


def _positive(name: str, key: str, value: Any) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise TenantFileError(f"tenant {name!r}: {key} must be a positive integer")
    return value


def _tenant(name: str, table: Any) -> tuple[Tenant, list[str]]:
    if not isinstance(table, dict):
        raise TenantFileError(f"tenant {name!r} must be a table")
    unknown = set(table) - _TENANT_KEYS
    if unknown:
        raise TenantFileError(f"tenant {name!r}: unknown key(s) {sorted(unknown)}")
    keys = table.get("keys")
    if not isinstance(keys, list) or not keys or not all(isinstance(k, str) and k for k in keys):
        raise TenantFileError(f"tenant {name!r}: keys must be a non-empty list of strings")
    group = table.get("cache_group")
    if group is not None and (not isinstance(group, str) or not group):
        raise TenantFileError(f"tenant {name!r}: cache_group must be a non-empty string")
    tenant = Tenant(name, _salt(f"group:{group}" if group else f"tenant:{name}"),
                    _positive(name, "max_concurrency", table.get("max_concurrency")),
                    _positive(name, "requests_per_minute", table.get("requests_per_minute")))
    return tenant, keys


class Tenants:
    """Key -> tenant, and each tenant's live limits (one event loop: no locks)."""

    def __init__(self, tenants: Mapping[str, Tenant], *, clock: Callable[[], float] = time.monotonic):
        self._by_digest = dict(tenants)
        self._clock = clock
        self._state: dict[str, _State] = {}

    @classmethod
    def from_file(cls, path: str | Path, *, clock: Callable[[], float] = time.monotonic) -> Tenants:
        try:
            data = tomllib.loads(Path(path).read_text())
        except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise TenantFileError(f"--api-keys {path}: {exc}") from None
        tables = data.get("tenants")
        if not isinstance(tables, dict) or not tables:
            raise TenantFileError(f"--api-keys {path}: no [tenants.NAME] tables")
        by_digest: dict[str, Tenant] = {}
        for name, table in tables.items():
            tenant, keys = _tenant(name, table)
            for key in keys:
                digest = key_digest(key)
                if digest in by_digest:
                    raise TenantFileError(f"--api-keys {path}: key {mask(key)} is listed twice")
                by_digest[digest] = tenant
        return cls(by_digest, clock=clock)

    def lookup(self, key: str) -> Tenant | None:
        return self._by_digest.get(key_digest(key))

    def names(self) -> list[str]:
        return sorted({t.name for t in self._by_digest.values()})

    def admit(self, tenant: Tenant) -> Callable[[], None]:
        """Take a slot (429 if over a limit); returns the call that gives it back."""
        state = self._state.setdefault(tenant.name, _State(
            tokens=float(tenant.requests_per_minute or 0), at=self._clock()))
        if tenant.max_concurrency is not None and state.in_flight >= tenant.max_concurrency:
            raise RateLimited(f"tenant {tenant.name!r} has {state.in_flight} requests in flight "
                              f"(max_concurrency {tenant.max_concurrency})",
                              retry_after_s=1.0, code="concurrency_limit_exceeded")
        if tenant.requests_per_minute is not None:
            self._take_token(tenant, tenant.requests_per_minute, state)
        state.in_flight += 1
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                state.in_flight -= 1

        return release

    def _take_token(self, tenant: Tenant, rpm: int, state: _State) -> None:
        now = self._clock()
        rate = rpm / 60.0
        state.tokens = min(float(rpm), state.tokens + (now - state.at) * rate)
        state.at = now
        if state.tokens < 1.0:
            wait = (1.0 - state.tokens) / rate
            raise RateLimited(f"tenant {tenant.name!r} is over {rpm} requests per minute",
                              retry_after_s=max(1.0, math.ceil(wait)),
                              code="rate_limit_exceeded")
        state.tokens -= 1.0

    def in_flight(self, name: str) -> int:
        state = self._state.get(name)
        return state.in_flight if state else 0
