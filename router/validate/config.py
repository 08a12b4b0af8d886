"""The parameters of one ``lmroute validate`` run, and its tiers.

Tiers, per prompt ``p`` (its home replica ``A = replicas[p mod n]``, the other ``B =
replicas[(p + 1) mod n]``, so with two replicas half the prompts are written by each and
both directions of the pool are read), run in this order, each tier's prompts
concurrently (up to ``concurrency``) and the tiers one after another:

    cold        A, a fresh random cache_salt s_p: nothing can be reused (the reference)
    warm        A again, s_p: A's GPU prefix cache
    cold-other  B, another fresh salt: B computing it (tells a replica that differs from
                a cache that corrupts)
    pool        B, s_p: B has no GPU copy, so the prefix comes from the shared pool
    evicted     every replica's GPU cache reset (POST /reset_prefix_cache), then A, s_p:
                A loads back from the pool what it computed itself

Each is compared with ``cold`` (``compare``). With one replica, ``cold-other`` and
``pool`` are skipped; ``evicted`` is skipped when ``evict`` is off or the engine does not
serve ``/reset_prefix_cache`` (vLLM: only with ``VLLM_SERVER_DEV_MODE=1``).
"""

from __future__ import annotations

from dataclasses import dataclass

TIERS = ("cold", "warm", "cold-other", "pool", "evicted")
CACHE_TIERS = frozenset({"warm", "pool", "evicted"})  # expected to report cached tokens
DEFAULT_LENGTHS = (1024, 8192, 32768)
DEFAULT_TOL = 0.05


@dataclass(frozen=True, slots=True)
class ValidateConfig:
    """``target`` (a router) or ``backends`` (replicas, direct), and the run's shape."""

    target: str | None = None
    backends: tuple[str, ...] = ()
    admin_key: str = ""
    model: str | None = None  # default: the first model the deployment lists
    lengths: tuple[int, ...] = DEFAULT_LENGTHS  # prompt tokens; over the context: skipped
    prompts: int = 4  # per length
    max_tokens: int = 16  # K: output tokens compared
    top_logprobs: int = 2
    seed: int = 0  # the requests' sampling seed
    prompt_seed: int | None = None  # the prompts' generator (None: a random one per run)
    logprob_tol: float = DEFAULT_TOL  # nats
    concurrency: int = 8
    evict: bool = True
    timeout_s: float = 300.0

    def __post_init__(self) -> None:
        if (self.target is None) == (not self.backends):
            raise ValueError("give --target ROUTER_URL or --backend URL (one or more), not both")
        if self.target is not None and not self.admin_key:
            raise ValueError("--target needs --admin-key: pinning a replica is admin-only")
        if self.prompts < 1 or self.max_tokens < 1 or self.concurrency < 1:
            raise ValueError("--prompts, --max-tokens and --concurrency must be at least 1")
        if self.top_logprobs < 2:
            raise ValueError("--top-logprobs must be at least 2 (the near-tie margin)")
        if not self.lengths or min(self.lengths) < 1:
            raise ValueError("--lengths must be positive token counts")
        if self.logprob_tol < 0:
            raise ValueError("--logprob-tol must be non-negative")
