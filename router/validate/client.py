"""Requests of a validation run: to one chosen replica, through a router or directly.

Through a router (``target``): ``GET /replicas`` (admin key) lists the replicas; each
completion carries ``Authorization: Bearer ADMIN_KEY`` and ``X-LMRoute-Pin-Replica:
URL`` (``router.pin``), so the router sends it to that replica and nowhere else;
``POST /reset_prefix_cache`` fans out to every replica. Directly (``backends``): the
same requests to each replica's own URL. HTTP is aiohttp, the router's own client, so
the command runs wherever the router is installed.

Every completion is ``/v1/completions`` with a token-id prompt (exact lengths, no
tokenizer here), ``temperature`` 0, the run's ``seed``, ``logprobs = top_logprobs``,
``max_tokens = K``, ``ignore_eos`` (K tokens from every reply) and
``return_tokens_as_token_ids`` (vLLM names tokens ``token_id:N``, so equal text with
different ids still differs).
"""

from __future__ import annotations

import random
from typing import Any

import aiohttp
import orjson

from router.pin import PIN_HEADER
from router.validate.compare import BadReply, Reply, parse_reply
from router.validate.config import ValidateConfig


class ValidateError(Exception):
    """The deployment could not be validated (unreachable, refused, malformed reply)."""


class Deployment:
    """The replicas under test and how to reach each (``async with``)."""

    def __init__(self, config: ValidateConfig) -> None:
        self.config = config
        self.replicas: list[str] = list(config.backends)
        self.model = config.model or ""
        self.max_model_len: int | None = None
        self._http: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Deployment:
        timeout = aiohttp.ClientTimeout(total=self.config.timeout_s)
        self._http = aiohttp.ClientSession(timeout=timeout)
        try:
            await self._discover()
        except BaseException:
            await self._http.close()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._http is not None:
            await self._http.close()

    def _auth(self) -> dict[str, str]:
        key = self.config.admin_key
        return {"Authorization": f"Bearer {key}"} if key else {}

    async def _call(self, method: str, url: str, body: Any = None,
                    headers: dict[str, str] | None = None) -> tuple[int, Any]:
        assert self._http is not None
        data = None if body is None else orjson.dumps(body)
        hdrs = {**self._auth(), **(headers or {}),
                **({"Content-Type": "application/json"} if data is not None else {})}
        try:
            async with self._http.request(method, url, data=data, headers=hdrs) as resp:
                raw = await resp.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ValidateError(f"{method} {url}: {exc!r}") from None
        try:
            return resp.status, orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError:
            return resp.status, raw.decode("utf-8", "replace")

    async def _discover(self) -> None:
        target = self.config.target
        if target is not None:
            status, data = await self._call("GET", target.rstrip("/") + "/replicas")
            if status != 200 or not isinstance(data, dict):
                raise ValidateError(f"GET {target}/replicas answered {status}: {data}")
            self.replicas = [str(r["url"]) for r in data.get("replicas", [])
                             if r.get("healthy", True)]
        if not self.replicas:
            raise ValidateError("no healthy replica to validate")
        base = target.rstrip("/") if target is not None else self.replicas[0]
        status, data = await self._call("GET", base + "/v1/models")
        entries = data.get("data", []) if status == 200 and isinstance(data, dict) else []
        if not self.model:
            if not entries:
                raise ValidateError(f"GET {base}/v1/models answered {status}; pass --model")
            self.model = str(entries[0]["id"])
        for entry in entries:
            if entry.get("id") == self.model and isinstance(entry.get("max_model_len"), int):
                self.max_model_len = int(entry["max_model_len"])

    def _base(self, replica: str) -> tuple[str, dict[str, str]]:
        if self.config.target is None:
            return replica, {}
        return self.config.target.rstrip("/"), {PIN_HEADER: replica}

    async def complete(self, replica: str, prompt: list[int], salt: str) -> Reply:
        """One greedy completion of ``prompt`` on ``replica`` under ``salt``."""
        c = self.config
        body = {"model": self.model, "prompt": prompt, "max_tokens": c.max_tokens,
                "temperature": 0, "seed": c.seed, "logprobs": c.top_logprobs,
                "cache_salt": salt, "ignore_eos": True, "return_tokens_as_token_ids": True}
        base, headers = self._base(replica)
        status, data = await self._call("POST", base + "/v1/completions", body, headers)
        if status != 200:
            raise ValidateError(f"completion on {replica} answered {status}: {data}")
        try:
            return parse_reply(data)
        except BadReply as exc:
            raise ValidateError(f"{replica}: {exc}") from None

    async def reset_prefix_caches(self) -> bool:
        """Empty every replica's GPU prefix cache; False where the engine cannot."""
        urls = ([self.config.target.rstrip("/")] if self.config.target is not None
                else self.replicas)
        for url in urls:
            status, _ = await self._call("POST", url + "/reset_prefix_cache")
            if status != 200:
                return False
        return True

    async def vocabulary(self, seed: int) -> list[int]:
        """Token ids to build prompts from: ``/tokenize`` of seeded words, else 100..1099."""
        rng = random.Random(seed)
        words = " ".join(f"{rng.choice('bcdfghklmnprstvz')}{rng.choice('aeiou')}"
                         f"{rng.choice('bcdfghklmnprstvz')}{rng.choice('aeiouy')}"
                         for _ in range(3000))
        base = (self.config.target.rstrip("/") if self.config.target is not None
                else self.replicas[0])
        try:
            status, data = await self._call("POST", base + "/tokenize",
                                            {"model": self.model, "prompt": words})
        except ValidateError:
            status, data = 0, None
        ids = data.get("tokens") if status == 200 and isinstance(data, dict) else None
        distinct = sorted({int(t) for t in (ids or [])[1:]})  # [0] may be a BOS
        return distinct if len(distinct) >= 50 else list(range(100, 1100))
