"""What a policy sees and what it decides: the immutable views of the routing seam.

``RequestView`` (one request, its prefix's ``Residency``), ``ReplicaView`` (one candidate
replica), ``Decision`` (the choice) and ``Outcome`` (what became of it), built by the
router or the simulator and read by every policy (``policies.base`` has the protocol).
They are a module of their own so that mypyc can compile them with the ``locality``
policy's modules (setup.py): a compiled policy then reads their fields as native
attributes; ``policies.base``'s runtime-checkable ``Protocol`` is beyond mypyc.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

ReplicaId = str
SessionKey = str

# Tokens per prefix block (LMCache's chunk): the one default for the router's token-mode
# blocks, its index and ``Residency`` (the router imports it from here).
DEFAULT_BLOCK_TOKENS = 256

# How deep into a prompt its ``RequestView.anchor`` is taken: prompts that share their
# first 16,384 tokens (a document) share a prefix worth placing together. A shorter prompt
# has none: a session's turns cross the depth once, and a router that then sees the
# session for the first time places it by the anchor where the turn before went by the
# session's key (at 4,096 tokens, the Mooncake trace's sessions paid for that with 4
# routers: p90 1.03x at the knee against 0.99x without the anchor).
ANCHOR_TOKENS = 16384


def anchor_key(chain: Sequence[int], block_tokens: int) -> int:
    """``RequestView.anchor`` of a prompt whose block chain is ``chain`` (chained keys:
    block ``i``'s key stands for the whole prefix through it): the key of the block that
    ends at ``ANCHOR_TOKENS``, or 0 for a chain shorter than that."""
    depth = max(1, ANCHOR_TOKENS // block_tokens)
    return chain[depth - 1] if len(chain) >= depth else 0


class Tier(StrEnum):
    """Where a prefix block lives, fastest first."""

    GPU = "gpu"
    POOL = "pool"
    MISS = "miss"


@dataclass(frozen=True, slots=True)
class Residency:
    """Where the request's prefix lives, as the index believes.

    ``gpu`` maps a replica to the number of leading blocks of the request's chain that
    its GPU prefix cache holds; ``pool`` is the number of leading blocks the shared pool
    holds. ``chain_blocks`` is the length of the chain that was looked up and
    ``block_tokens`` about how many tokens one block stands for. ``readers``: how many of
    the router's unsettled requests hold the longest prefix the index holds too
    (``router.in_flight``; 0 for one only in flight).
    """

    chain_blocks: int = 0
    block_tokens: int = DEFAULT_BLOCK_TOKENS
    gpu: Mapping[ReplicaId, int] = field(default_factory=dict)
    pool: int = 0
    readers: int = 0

    def gpu_blocks(self, replica: ReplicaId) -> int:
        return self.gpu.get(replica, 0)


EMPTY_RESIDENCY = Residency()


@dataclass(frozen=True, slots=True)
class RequestView:
    """What a policy knows about one request.

    ``session`` is the session key (X-Session-ID header, else the body's ``user``, else a
    hash of the system prompt and first user message). ``prompt_tokens`` is an estimate
    (the router: exact in token mode, ``--tokenizer``; else the prompt's text length / 4;
    the simulator: exact).
    ``now`` is the caller's clock in seconds, so policies never read one. ``exclude``
    names replicas already tried for this request (failover): a policy must not pick them.
    ``request_id`` is the router's own id, unique per request: never the client's
    X-Request-Id, which two requests may share (policy state keyed on it would leak).
    ``anchor``: the key of the prompt's prefix that every router computes alike
    (``anchor_key``: its chain's block at ``ANCHOR_TOKENS``; 0: a shorter prompt), so
    routers that do not know each other's placements can still agree where a new prefix goes.
    ``generates``: a prompt the engine prefills to generate (chat, completions, responses,
    messages); False for the routes with no prompt prefix (``/tokenize``, embeddings,
    rerank, audio uploads, ...), whose replies say nothing about a prefill's cost.
    """

    request_id: str
    model: str
    session: SessionKey
    endpoint: str = "chat"
    stream: bool = False
    prompt_tokens: int = 0
    max_tokens: int | None = None
    residency: Residency = EMPTY_RESIDENCY
    last_replica: ReplicaId | None = None
    now: float = 0.0
    exclude: frozenset[ReplicaId] = frozenset()
    anchor: int = 0
    generates: bool = True


@dataclass(frozen=True, slots=True)
class ReplicaView:
    """What a policy knows about one replica at decision time.

    ``in_flight`` is the router's own count of requests it has outstanding there;
    ``running``/``waiting``/``kv_usage`` are the engine's last scraped
    ``vllm:num_requests_running``, ``vllm:num_requests_waiting`` and
    ``vllm:kv_cache_usage_perc`` (0..1); ``in_flight_at_scrape``: the router's count when
    that scrape was read (None: unknown, taken as ``in_flight``).
    """

    id: ReplicaId
    url: str
    healthy: bool = True
    in_flight: int = 0
    running: float = 0.0
    waiting: float = 0.0
    kv_usage: float = 0.0
    in_flight_at_scrape: int | None = None

    @property
    def others(self) -> float:
        """The engine's requests at the last scrape beyond this router's own at that moment:
        other routers' (or workers'). Against the count now, a scrape up to an interval old
        saw requests of ours that have ended since, as if another router had sent them."""
        own = self.in_flight if self.in_flight_at_scrape is None else self.in_flight_at_scrape
        return max(0.0, self.running + self.waiting - own)

    @property
    def others_waiting(self) -> float:
        """Other routers' requests waiting at the engine: at most its waiting count and
        its requests not ours (``others``)."""
        return min(self.waiting, self.others)

    @property
    def load(self) -> float:
        """In-flight plus queued at the engine: the load measure of ``least_loaded``."""
        return self.in_flight + self.waiting


@dataclass(frozen=True, slots=True)
class Decision:
    """The chosen replica and why, in short stable words (``sticky``, ``gpu-hit``, ...).

    ``arm`` names the A/B arm whose policy decided (``policies.split``); "" otherwise.
    """

    replica: ReplicaId
    reason: str
    predicted_ttft_s: float | None = None
    arm: str = ""


@dataclass(frozen=True, slots=True)
class Outcome:
    """What became of a dispatched request, fed back through ``Policy.observe``.

    A request is observed once or twice: ``phase="first_token"`` when its first byte
    arrives (streamed replies; ``ttft_s`` set), then ``phase="done"`` when it ends
    (``total_s`` set; a non-streamed reply reports its ``ttft_s`` only here, as the time
    of the whole reply). ``ok`` is false when the replica failed the request. ``at`` is the
    caller's clock at the observation, in the same time base as ``RequestView.now``.
    ``prompt_tokens`` / ``cached_tokens``: the engine's own count of the prompt and of the
    part it did not compute (vLLM's ``usage.prompt_tokens`` and
    ``usage.prompt_tokens_details.cached_tokens``: GPU prefix-cache hits and tokens loaded
    through the KV connector together), when the reply reported them (``done`` only).
    """

    request: RequestView
    decision: Decision
    ok: bool
    ttft_s: float | None = None
    total_s: float | None = None
    phase: str = "done"
    at: float | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
