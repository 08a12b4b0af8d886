"""Model-aware routing: which replica serves which model, and who may take a request.

``ModelMap`` keeps each replica's model ids (its served model names and its LoRA
adapters, all listed by vLLM's ``GET /v1/models``), fetched when a replica joins and every
``models_refresh_s`` after (``refresh_now`` after a LoRA adapter was loaded or unloaded
through the router). A replica whose list was never read (it did not answer yet) is
assumed to serve any model: a new replica is never a false 404, and a wrong guess is the
replica's own 404, passed through. A failed refresh keeps the last list.

``candidates(parsed)``, the proxy's filter before the policy chooses:
  - pinned (``parsed.replica``, e.g. a stored response): that replica only, drained or not;
  - otherwise the replicas not draining that serve ``parsed.model`` (any, if the body
    names none: vLLM then uses its served model);
  - a model no replica serves, healthy or not, is ``ModelNotFound`` (404, vLLM's shape);
    a model whose replicas are all ejected or draining is the policy's 503.

Parameters: ``interval_s`` (0: only on join and on demand), ``timeout_s`` per fetch.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from policies.base import ReplicaView
from router.errors import ModelNotFound
from router.openai_api import ParsedRequest
from router.replicas import Replica, ReplicaSet, list_models
from router.tasks import cancel_all
from router.upstream import Upstream

log = logging.getLogger("lmroute.models")


class ModelMap:
    """Replica id -> the model ids it serves (``None``: not known yet)."""

    def __init__(self, replicas: ReplicaSet, upstream: Upstream, *, interval_s: float,
                 timeout_s: float) -> None:
        self._replicas = replicas
        self._upstream = upstream
        self._interval_s = interval_s
        self._timeout_s = timeout_s
        self._served: dict[str, frozenset[str]] = {}
        self._entries: dict[str, list[dict[str, Any]]] = {}
        self._tasks: list[asyncio.Task[None]] = []

    # -- what is known ---------------------------------------------------------------
    def of(self, replica: str) -> list[str] | None:
        served = self._served.get(replica)
        return None if served is None else sorted(served)

    def serves(self, replica: str, model: str) -> bool:
        served = self._served.get(replica)
        return served is None or model in served

    def union(self) -> list[dict[str, Any]]:
        """Every known ``/v1/models`` entry, the first replica's winning per id."""
        seen: dict[str, dict[str, Any]] = {}
        for replica in self._replicas.replicas:
            for entry in self._entries.get(replica.id, []):
                seen.setdefault(str(entry["id"]), entry)
        return list(seen.values())

    def candidates(self, parsed: ParsedRequest) -> list[ReplicaView]:
        replicas = self._replicas.replicas
        if parsed.replica is not None:
            return [r.view() for r in replicas if r.id == parsed.replica]
        model = parsed.model
        if model and not any(self.serves(r.id, model) for r in replicas):
            raise ModelNotFound(model)
        return [r.view() for r in replicas
                if not r.draining and (not model or self.serves(r.id, model))]

    # -- fetching --------------------------------------------------------------------
    async def fetch(self, replica: Replica) -> None:
        """Read one replica's ``/v1/models``; keep the last list when it cannot answer."""
        entries = await list_models(self._upstream, replica.url, self._timeout_s)
        if not entries:
            return
        self._entries[replica.id] = entries
        self._served[replica.id] = frozenset(str(e["id"]) for e in entries)

    def forget(self, replica: str) -> None:
        self._served.pop(replica, None)
        self._entries.pop(replica, None)

    async def refresh_now(self) -> None:
        await asyncio.gather(*(self.fetch(r) for r in self._replicas.replicas))

    async def _loop(self) -> None:
        while True:
            await self.refresh_now()
            await asyncio.sleep(self._interval_s)

    def start(self) -> None:
        if self._interval_s > 0:
            self._tasks.append(asyncio.create_task(self._loop()))
        else:
            self._tasks.append(asyncio.create_task(self.refresh_now()))

    async def stop(self) -> None:
        await cancel_all(self._tasks)
