"""What an A/B run compares and sends: arm specs, and the sessions of every block.

Arm spec (``--arms A,B``): ``POLICY[@KEY=VALUE...]``. Keys the emulated deployment knows
(``DEPLOYMENT_KEYS``: ``pool=on|off``) configure the deployment and need ``--emulated``
(the deployment is then restarted for every block with the arm's setting, like the
study's restart blocks); every other key is an option of the policy's typed config
(``locality@stay_margin=0.3``, see ``policies.registry``). Examples:
``fixed,round_robin``; ``alternating@pool=off,alternating@pool=on``.

Sessions (seeded; a pure function of ``seed``, block and index, so a resumed run sends
the same text): session ``i`` of block ``b`` has key ``ab{seed}-b{b}-s{i}``.

- generated: a first user message of log-uniform length in [``min_start_tokens``,
  ``max_start_tokens``], then ``turns - 1`` turns each appending the reply and
  ``added_tokens`` of new user text (the study's multi-turn sessions);
- trace (``--trace``, Mooncake format, ``sim.des.trace``): the trace's conversations (records
  grouped by their first two block ids, kept when they have 2+ requests, in order of first
  arrival) fill the blocks in order; turn ``k`` is the conversation's ``k``-th request, one
  user message synthesised from its ``hash_ids``: each 512-token block id becomes a fixed
  random text (``text_of``), so equal ids give equal text and shared prefixes stay shared,
  cut to ``input_length`` tokens.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import xxhash

from policies.split import parse_policy_ref
from sim.des.trace import TRACE_BLOCK_TOKENS, TraceRecord, load_trace, session_key
from sim.emulator.tokens import BYTES_PER_TOKEN
from sim.experiments.session import Messages, SessionScript, log_uniform_tokens, text_of

DEPLOYMENT_KEYS = {"pool"}
_TRACE_SEED = 0x7A3E_0000_0000


@dataclass(frozen=True, slots=True)
class AbArm:
    """One arm: label ``A``/``B``, the spec as written, its policy and the two option sets."""

    label: str
    spec: str
    policy: str
    options: dict[str, Any] = field(default_factory=dict)
    deployment: dict[str, Any] = field(default_factory=dict)

    @property
    def pool(self) -> bool | None:
        value = self.deployment.get("pool")
        if value is None:
            return None
        return str(value).lower() in ("on", "true", "1")


def parse_arms(text: str) -> list[AbArm]:
    specs = [s.strip() for s in text.split(",") if s.strip()]
    if len(specs) != 2:
        raise ValueError(f"--arms needs exactly two arms, A,B; got {specs}")
    arms = []
    for label, spec in zip("AB", specs, strict=True):
        policy, opts = parse_policy_ref(spec)
        deployment = {k: v for k, v in opts.items() if k in DEPLOYMENT_KEYS}
        for key, value in deployment.items():
            if str(value).lower() not in ("on", "off", "true", "false"):
                raise ValueError(f"arm {spec!r}: {key} must be on or off")
        options = {k: v for k, v in opts.items() if k not in DEPLOYMENT_KEYS}
        arms.append(AbArm(label, spec, policy, options, deployment))
    return arms


@dataclass(frozen=True, slots=True)
class AbSession:
    """One session: its block, key, and either a generated shape or trace requests."""

    block: int
    index: int
    key: str
    text_seed: int
    start_tokens: int = 0
    trace: tuple[TraceRecord, ...] = ()

    @property
    def done_key(self) -> str:
        return f"{self.block}/{self.index}"



def _key(seed: int, block: int, index: int) -> str:
    return f"ab{seed}-b{block}-s{index}"


def plan_generated(seed: int, blocks: int, sessions: int, min_start: int,
                   max_start: int) -> list[AbSession]:
    if not 0 < min_start <= max_start:
        raise ValueError("start tokens: need 0 < min <= max")
    out = []
    for b in range(blocks):
        for i in range(sessions):
            key = _key(seed, b, i)
            rng = random.Random(key)
            out.append(AbSession(b, i, key, xxhash.xxh3_64_intdigest(key.encode()),
                                   int(log_uniform_tokens(rng, min_start, max_start))))
    return out


def trace_conversations(records: Sequence[TraceRecord], min_turns: int = 2
                        ) -> list[tuple[TraceRecord, ...]]:
    groups: dict[str, list[TraceRecord]] = {}
    for r in sorted(records, key=lambda r: r.timestamp_ms):
        groups.setdefault(session_key(r.hash_ids), []).append(r)
    return [tuple(g) for g in groups.values() if len(g) >= min_turns]


def plan_trace(path: str, seed: int, blocks: int, sessions: int) -> list[AbSession]:
    conversations = trace_conversations(load_trace(path))
    need = blocks * sessions
    if len(conversations) < need:
        raise ValueError(f"{path}: {len(conversations)} conversations, {need} needed")
    return [AbSession(b, i, _key(seed, b, i), 0, trace=conversations[b * sessions + i])
            for b in range(blocks) for i in range(sessions)]


def trace_prompt(record: TraceRecord) -> str:
    """The record's prompt: one fixed text per 512-token block id, cut to its length."""
    text = "".join(text_of(_TRACE_SEED + h, TRACE_BLOCK_TOKENS) for h in record.hash_ids)
    return text[: record.input_length * BYTES_PER_TOKEN]


def script(plan: AbSession, turns: int, added_tokens: int, output_tokens: int) -> SessionScript:
    """What session ``plan`` sends: generated turns grow the history by the reply and
    ``added_tokens`` of new text; trace turns are each one synthesised user message, and
    their reply is the record's ``output_length`` capped at ``output_tokens``."""
    if plan.trace:
        records = plan.trace
        return SessionScript(
            plan.key, min(turns, len(records)),
            [{"role": "user", "content": trace_prompt(records[0])}],
            lambda k, history, reply: [{"role": "user", "content": trace_prompt(records[k])}],
            lambda k: max(1, min(output_tokens, records[k].output_length)))

    def follow(k: int, history: Messages, reply: str) -> Messages:
        return [*history, {"role": "assistant", "content": reply},
                {"role": "user", "content": text_of(plan.text_seed + k, added_tokens)}]

    return SessionScript(plan.key, turns,
                         [{"role": "user", "content": text_of(plan.text_seed, plan.start_tokens)}],
                         follow, lambda k: output_tokens)
