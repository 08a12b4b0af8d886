"""``lmroute ab``: compare two routing policies (or deployments) on live traffic.

Designs (``design``):
- ``abba``: blocks in the order A B B A (repeated for 8, 12, ... blocks): before each block
  the router's policy is switched to the block's arm through its admin API
  (``POST /admin/policy``, ``Authorization: Bearer KEY``); an arm with deployment options
  (``@pool=on|off``, ``--emulated`` only) restarts the emulated deployment for every block
  with its setting. Linear drift in the system hits both arms alike.
- ``interleaved``: the router runs ``split`` with both arms at weight 50 (salt
  ``ab{seed}``), so every session is assigned to an arm at random by its key and the two
  arms run side by side; each turn's arm is read from the ``x-lmroute-arm`` header.

In each block ``sessions_per_block`` sessions (``sim.experiments.ab_sessions``) run through the
router, ``concurrency`` at a time (default 1: one at a time, arms never interfere), every
turn streamed and timed by ``sim.driver.chat_turn``; a failed turn is recorded with its
error and ends its session. Times are model seconds (wall / ``time_scale``; 1 for a real
``target``). The original policy of a real router is read first and restored at the end.

Emulated (``emulated=True``): two replicas of ``profile`` (default the study's
``study-27b``) sharing one pool (``pool``, or the arm's setting), and the router, all on
127.0.0.1 in this event loop (``sim.emulator.deployment.emulated_deployment``), as
``lmroute demo`` does.

Resume: the JSON document is rewritten after every finished session (``turns`` and ``done``,
the sessions finished); ``run_ab(..., resume=doc)`` skips the finished ones and reruns a
session that was cut off.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass, fields
from typing import Any

import httpx

from sim.experiments.ab_sessions import AbArm, AbSession, parse_arms, plan_generated, plan_trace, script
from sim.experiments.ab_stats import abba_order
from sim.experiments.session import MODEL, TurnResult, run_session


@dataclass(frozen=True, slots=True)
class AbConfig:
    arms: str
    design: str = "abba"
    blocks: int = 4
    sessions_per_block: int = 8
    turns: int = 5
    min_start_tokens: int = 8_192
    max_start_tokens: int = 32_768
    added_tokens: int = 1_024
    output_tokens: int = 8
    concurrency: int = 1
    target: str = ""
    emulated: bool = False
    pool: str = "on"
    profile: str = "study-27b"
    time_scale: float = 0.1
    trace: str = ""
    model: str = MODEL
    seed: int = 0

    def validate(self) -> list[AbArm]:
        arms = parse_arms(self.arms)
        if self.design not in ("abba", "interleaved"):
            raise ValueError("--design must be abba or interleaved")
        if self.design == "abba":
            abba_order(self.blocks)
        elif self.blocks < 1:
            raise ValueError("--blocks must be >= 1")
        if self.emulated == bool(self.target):
            raise ValueError("give exactly one of --target URL and --emulated")
        if any(a.deployment for a in arms):
            if not self.emulated:
                raise ValueError("deployment options (@pool=...) need --emulated")
            if self.design != "abba":
                raise ValueError("deployment arms need --design abba (one deployment per block)")
        if self.pool not in ("on", "off"):
            raise ValueError("--pool must be on or off")
        if self.sessions_per_block < 1 or self.turns < 1 or self.concurrency < 1:
            raise ValueError("sessions per block, turns and concurrency must be >= 1")
        return arms

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> AbConfig:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


class Admin:
    """The router's admin API: read and switch the active policy."""

    def __init__(self, client: httpx.AsyncClient, url: str, key: str):
        self.client, self.url = client, url.rstrip("/") + "/admin/policy"
        self.headers = {"authorization": f"Bearer {key}"}

    async def get(self) -> dict[str, Any]:
        resp = await self.client.get(self.url, headers=self.headers)
        resp.raise_for_status()
        out: dict[str, Any] = resp.json()
        return out

    async def set(self, policy: str, options: dict[str, Any] | None = None) -> dict[str, Any]:
        resp = await self.client.post(self.url, headers=self.headers,
                                      json={"policy": policy, "options": options or {}})
        if resp.status_code != 200:
            raise RuntimeError(f"admin API refused {policy}: {resp.status_code} {resp.text}")
        out: dict[str, Any] = resp.json()
        return out


def split_options(arms: list[AbArm], seed: int) -> dict[str, Any]:
    return {"salt": f"ab{seed}", "arms": [
        {"name": a.label, "policy": a.policy, "weight": 50, "options": a.options} for a in arms]}


@contextlib.asynccontextmanager
async def emulated(cfg: AbConfig, pool_on: bool, policy: str, admin_key: str
                   ) -> AsyncIterator[str]:
    """Two replicas sharing a pool (or none) and the router; yields the router's URL."""
    from sim.emulator.deployment import emulated_deployment
    from sim.replica.profiles import load_profile

    async with emulated_deployment(load_profile(cfg.profile), policy=policy, pool_on=pool_on,
                                   model=cfg.model, time_scale=cfg.time_scale,
                                   admin_key=admin_key) as deployment:
        yield deployment.router_url


class Runner:
    """Runs the sessions of one A/B test and keeps the resumable document."""

    def __init__(self, cfg: AbConfig, admin_key: str, doc: dict[str, Any],
                 save: Callable[[dict[str, Any]], None], on_turn: Callable[[], None]):
        self.cfg, self.arms = cfg, cfg.validate()
        self.admin_key = admin_key
        self.doc, self.save, self.on_turn = doc, save, on_turn
        self.scale = cfg.time_scale if cfg.emulated else 1.0
        self.done = set(doc["done"])

    def plans(self) -> list[AbSession]:
        c = self.cfg
        if c.trace:
            return plan_trace(c.trace, c.seed, c.blocks, c.sessions_per_block)
        return plan_generated(c.seed, c.blocks, c.sessions_per_block, c.min_start_tokens,
                              c.max_start_tokens)

    async def session(self, client: httpx.AsyncClient, url: str, plan: AbSession,
                      arm: str | None) -> None:
        c = self.cfg
        turns = await run_session(client, url, script(plan, c.turns, c.added_tokens,
                                                      c.output_tokens),
                                  time_scale=self.scale, model=c.model, on_turn=self.on_turn)
        rows = [self._row(plan, t, arm) for t in turns]
        if arm is None:  # interleaved: a session whose first turn failed takes its later arm
            seen = {r["arm"] for r in rows if r["arm"] != "?"}
            for r in rows:
                r["arm"] = next(iter(seen)) if len(seen) == 1 else r["arm"]
        self.doc["turns"] += rows
        self.doc["done"].append(plan.done_key)
        self.save(self.doc)

    @staticmethod
    def _row(plan: AbSession, t: TurnResult, arm: str | None) -> dict[str, Any]:
        row: dict[str, Any] = {"block": plan.block, "session": plan.key, "turn": t.turn}
        if t.timing is None:
            return row | {"arm": arm or "?", "ttft_s": None, "total_s": None, "error": t.error}
        turn = t.timing
        return row | {"arm": arm or turn.arm or "?", "ttft_s": turn.ttft_s,
                      "total_s": turn.total_s, "error": None, "replica": turn.replica,
                      "reason": turn.reason, "prompt_tokens": turn.prompt_tokens,
                      "cached_tokens": turn.cached_tokens}

    async def block(self, client: httpx.AsyncClient, url: str, plans: list[AbSession],
                    arm: str | None) -> None:
        gate = asyncio.Semaphore(self.cfg.concurrency)

        async def one(plan: AbSession) -> None:
            async with gate:
                await self.session(client, url, plan, arm)

        await asyncio.gather(*(one(p) for p in plans))

    async def run(self) -> None:
        cfg, arms = self.cfg, {a.label: a for a in self.arms}
        plans = [p for p in self.plans() if p.done_key not in self.done]
        by_block: dict[int, list[AbSession]] = {}
        for p in plans:
            by_block.setdefault(p.block, []).append(p)
        order = abba_order(cfg.blocks) if cfg.design == "abba" else [""] * cfg.blocks
        restart = any(a.deployment for a in self.arms)
        async with httpx.AsyncClient(timeout=httpx.Timeout(900.0)) as client, \
                contextlib.AsyncExitStack() as stack:
            url = cfg.target
            if cfg.emulated and not restart:
                url = await stack.enter_async_context(
                    emulated(cfg, cfg.pool == "on", self.arms[0].policy, self.admin_key))
            admin = Admin(client, url, self.admin_key) if url else None
            original = await admin.get() if admin and cfg.target else None
            if cfg.design == "interleaved" and admin is not None:
                await admin.set("split", split_options(self.arms, cfg.seed))
            for b in sorted(by_block):
                label = order[b] or None
                arm = arms[label] if label else None
                async with contextlib.AsyncExitStack() as per_block:
                    if restart and arm is not None:
                        pool = arm.pool if arm.pool is not None else cfg.pool == "on"
                        url = await per_block.enter_async_context(
                            emulated(cfg, pool, arm.policy, self.admin_key))
                        admin = Admin(client, url, self.admin_key)
                    if arm is not None and admin is not None:
                        await admin.set(arm.policy, arm.options)
                    await self.block(client, url, by_block[b], label)
            if original is not None and admin is not None:
                await admin.set(original["policy"], original.get("options") or {})


def new_document(cfg: AbConfig) -> dict[str, Any]:
    return {"config": asdict(cfg), "turns": [], "done": [],
            "units": "model seconds (wall seconds / time_scale)" if cfg.emulated else "seconds"}


async def run_ab(cfg: AbConfig, *, admin_key: str = "", resume: dict[str, Any] | None = None,
                 save: Callable[[dict[str, Any]], None] = lambda doc: None,
                 on_turn: Callable[[], None] = lambda: None) -> dict[str, Any]:
    """Run (or continue) an A/B test; returns the document with every turn measured."""
    began = time.perf_counter()
    doc = resume if resume is not None else new_document(cfg)
    key = admin_key or (secrets.token_hex(16) if cfg.emulated else "")
    if not key:
        raise ValueError("switching the router's policy needs --admin-key (the router's key)")
    await Runner(cfg, key, doc, save, on_turn).run()
    doc["wall_s"] = doc.get("wall_s", 0.0) + time.perf_counter() - began
    return doc
