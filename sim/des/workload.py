"""Workloads: what arrives when. Seeded generators of sessions and two ways to release them.

A workload is a list of ``SessionSpec`` (a session key and its turns, each turn a prompt
chain, prompt length and reply length) plus a release rule:

- ``SessionWorkload(sessions, starts=None)``: closed loop, one session after another; the
  next session's first turn arrives when the previous session's last turn has finished
  (the study's sequential measurements).
- ``SessionWorkload(sessions, starts=[...])``: session ``i`` opens at ``starts[i]`` (e.g.
  Poisson arrivals); inside a session each turn arrives ``think_s`` after the previous
  one finished (a user reads the reply, then types).
- ``OpenLoop(arrivals)``: fixed arrival times, nothing depends on completions (trace replay,
  ``sim.des.trace``).

Chains: a session's prompt grows turn by turn; its chain is the leading ``prompt // B``
keys of one key stream (``B`` = chunk tokens), so turn ``k+1`` extends turn ``k``'s chain
and the model and index see a reusable prefix. Keys come from a ``KeyAlloc`` (a counter
per experiment: fresh ints stand in for our chained xxh3 hashes). A shared system prompt
is a key tuple put at the head of every session's stream.

Generators take an injected ``random.Random``; ``jitter`` spreads sizes uniformly by
+-jitter (relative) so repeated measurements differ, as real questions do.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

BlockKey = int


@dataclass(frozen=True, slots=True)
class TurnSpec:
    """One turn of a session: its prompt chain, prompt length and reply length (tokens)."""

    chain: tuple[BlockKey, ...]
    prompt_tokens: int
    output_tokens: int


@dataclass(frozen=True, slots=True)
class SessionSpec:
    """One session: ``tag`` names what an experiment groups it by; ``measured`` false for warm-up."""

    session: str
    turns: tuple[TurnSpec, ...]
    tag: str = ""
    think_s: float = 0.0
    measured: bool = True


@dataclass(frozen=True, slots=True)
class SimRequest:
    request_id: str
    session: str
    chain: tuple[BlockKey, ...]
    prompt_tokens: int
    output_tokens: int
    tag: str = ""
    turn: int = 0
    index: int = 0  # the session's position in its workload
    measured: bool = True


Arrivals = list[tuple[float, SimRequest]]


class Workload(Protocol):
    def initial(self, start: float) -> Arrivals: ...

    def after(self, request: SimRequest, finished_at: float) -> Arrivals: ...


def _request(spec: SessionSpec, index: int, turn: int) -> SimRequest:
    t = spec.turns[turn]
    return SimRequest(f"{spec.session}/{turn}", spec.session, t.chain, t.prompt_tokens,
                      t.output_tokens, spec.tag, turn, index, spec.measured)


class SessionWorkload:
    """Sessions released one after another (``starts=None``) or at given offsets."""

    def __init__(self, sessions: Sequence[SessionSpec], starts: Sequence[float] | None = None,
                 gap_s: float = 0.0) -> None:
        if starts is not None and len(starts) != len(sessions):
            raise ValueError("one start time per session")
        self.sessions = list(sessions)
        self.starts = None if starts is None else list(starts)
        self.gap_s = gap_s

    def initial(self, start: float) -> Arrivals:
        if not self.sessions:
            return []
        if self.starts is None:
            return [(start, _request(self.sessions[0], 0, 0))]
        return [(start + s, _request(spec, i, 0))
                for i, (s, spec) in enumerate(zip(self.starts, self.sessions, strict=True))]

    def after(self, request: SimRequest, finished_at: float) -> Arrivals:
        spec = self.sessions[request.index]
        if request.turn + 1 < len(spec.turns):
            return [(finished_at + spec.think_s, _request(spec, request.index, request.turn + 1))]
        nxt = request.index + 1
        if self.starts is None and nxt < len(self.sessions):
            return [(finished_at + self.gap_s, _request(self.sessions[nxt], nxt, 0))]
        return []


class OpenLoop:
    """Arrivals at fixed offsets from the start, independent of completions."""

    def __init__(self, arrivals: Arrivals) -> None:
        self.arrivals = arrivals

    def initial(self, start: float) -> Arrivals:
        return [(start + t, r) for t, r in self.arrivals]

    def after(self, request: SimRequest, finished_at: float) -> Arrivals:
        return []


class KeyAlloc:
    """Fresh block keys; one allocator per experiment, so keys never repeat across sessions."""

    def __init__(self, base: int = 1 << 40) -> None:
        self._next = base

    def take(self, n: int) -> tuple[BlockKey, ...]:
        first = self._next
        self._next += n
        return tuple(range(first, first + n))


def _jit(rng: random.Random, value: float, jitter: float) -> int:
    return max(1, round(value * rng.uniform(1 - jitter, 1 + jitter))) if jitter else round(value)


def grow_session(keys: KeyAlloc, session: str, start_tokens: int, added: Sequence[int],
                 outputs: Sequence[int], chunk: int, *, shared: tuple[BlockKey, ...] = (),
                 tag: str = "", think_s: float = 0.0) -> SessionSpec:
    """Turn ``k``'s prompt = turn ``k-1``'s prompt + its reply + ``added[k-1]`` new tokens."""
    prompts = [start_tokens]
    for k in range(1, len(outputs)):
        prompts.append(prompts[-1] + outputs[k - 1] + added[k - 1])
    stream = shared + keys.take(max(0, prompts[-1] // chunk - len(shared)))
    turns = tuple(TurnSpec(stream[: p // chunk], p, o) for p, o in zip(prompts, outputs, strict=True))
    return SessionSpec(session, turns, tag, think_s)


def study_session(keys: KeyAlloc, rng: random.Random, session: str, start_tokens: int, chunk: int,
                  *, added_tokens: int = 2048, output_tokens: int = 8, turns: int = 6,
                  jitter: float = 0.0, tag: str = "") -> SessionSpec:
    """The study's six-turn session (sim.experiments.study): +2,048-token messages, 8-token replies."""
    added = [_jit(rng, added_tokens, jitter) for _ in range(turns - 1)]
    return grow_session(keys, session, start_tokens, added, [output_tokens] * turns, chunk, tag=tag)


def prefix_chain(keys: KeyAlloc, rng: random.Random, session: str, tokens: int, chunk: int,
                 *, turns: int = 2, question_tokens: int = 64, jitter: float = 0.0,
                 tag: str = "") -> SessionSpec:
    """A document of ``round(tokens / B)`` whole chunks asked ``turns`` different questions."""
    blocks = max(1, round(tokens / chunk))
    doc = keys.take(blocks)
    qs = [_jit(rng, question_tokens, jitter) for _ in range(turns)]
    return SessionSpec(session, tuple(TurnSpec(doc, blocks * chunk + q, 1) for q in qs), tag)


@dataclass(frozen=True, slots=True)
class SessionMix:
    """Random chat sessions for the load sweeps. Token counts are inclusive ranges.

    ``first_tokens`` is drawn log-uniformly (many short starts, a few long documents);
    ``system_tokens`` is a system prompt every session shares (a tenant's template).
    """

    system_tokens: int = 3136
    first_tokens: tuple[int, int] = (4096, 65536)
    turns: tuple[int, int] = (2, 8)
    added_tokens: tuple[int, int] = (128, 2048)
    output_tokens: tuple[int, int] = (32, 512)
    think_s: float = 20.0


def mix_session(keys: KeyAlloc, rng: random.Random, session: str, mix: SessionMix, chunk: int,
                shared: tuple[BlockKey, ...], tag: str = "") -> SessionSpec:
    lo, hi = mix.first_tokens
    first = mix.system_tokens + round(math.exp(rng.uniform(math.log(lo), math.log(hi))))
    n = rng.randint(*mix.turns)
    added = [rng.randint(*mix.added_tokens) for _ in range(n - 1)]
    outputs = [rng.randint(*mix.output_tokens) for _ in range(n)]
    return grow_session(keys, session, first, added, outputs, chunk, shared=shared, tag=tag,
                        think_s=mix.think_s)


def poisson_sessions(rng: random.Random, rate_per_s: float, duration_s: float, mix: SessionMix,
                     chunk: int, keys: KeyAlloc | None = None, tag: str = "") -> SessionWorkload:
    """Sessions opening as a Poisson process of ``rate_per_s`` over ``duration_s`` seconds."""
    keys = keys or KeyAlloc()
    shared = keys.take(mix.system_tokens // chunk)
    starts: list[float] = []
    t = rng.expovariate(rate_per_s)
    while t < duration_s:
        starts.append(t)
        t += rng.expovariate(rate_per_s)
    sessions = [mix_session(keys, rng, f"s{i}", mix, chunk, shared, tag) for i in range(len(starts))]
    return SessionWorkload(sessions, starts)
