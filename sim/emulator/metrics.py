"""The emulated replica's Prometheus metrics, under vLLM's names
(vLLM's ``vllm/v1/metrics/loggers.py``).

Labels ``model_name`` and ``engine`` as vLLM sets them. Counters are declared without the
``_total`` suffix, which prometheus_client appends, so the exposition carries e.g.
``vllm:prefix_cache_hits_total``. Token counters count tokens, as vLLM's do:
``prefix_cache_*`` for the engine's own (GPU) prefix cache, ``external_prefix_cache_*`` for
the KV connector (the LMCache pool), ``prompt_tokens_cached`` for both.
``vllm:cache_config_info`` is a constant 1 whose labels describe the cache.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)


@dataclass
class ReplicaMetrics:
    """One registry per replica (several replicas can share a process)."""

    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        labels = ["model_name", "engine"]
        r = self.registry

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, labels, registry=r)

        self.running = Gauge("vllm:num_requests_running", "requests prefilling or decoding",
                             labels, registry=r)
        self.waiting = Gauge("vllm:num_requests_waiting", "requests queued for prefill",
                             labels, registry=r)
        self.kv_usage = Gauge("vllm:kv_cache_usage_perc", "KV-cache usage, 0..1", labels,
                              registry=r)
        self.prompt_tokens = counter("vllm:prompt_tokens", "prefill tokens processed")
        self.prompt_tokens_cached = counter("vllm:prompt_tokens_cached",
                                            "prompt tokens not computed (local + external hits)")
        self.generation_tokens = counter("vllm:generation_tokens", "generation tokens")
        self.prefix_queries = counter("vllm:prefix_cache_queries",
                                      "tokens queried in the GPU prefix cache")
        self.prefix_hits = counter("vllm:prefix_cache_hits", "tokens hit in the GPU prefix cache")
        self.external_queries = counter("vllm:external_prefix_cache_queries",
                                        "tokens queried in the KV connector (shared pool)")
        self.external_hits = counter("vllm:external_prefix_cache_hits",
                                     "tokens loaded from the KV connector (shared pool)")
        self.preemptions = counter("vllm:num_preemptions", "preemptions (never, here)")
        self.requests = Counter("vllm:request_success", "finished requests",
                                [*labels, "finished_reason"], registry=r)
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "time to first token",
                              labels, registry=r, buckets=_LATENCY_BUCKETS)
        self.queue_time = Histogram("vllm:request_queue_time_seconds", "time waiting for prefill",
                                    labels, registry=r, buckets=_LATENCY_BUCKETS)
        self.cache_config = Gauge("vllm:cache_config_info", "cache configuration",
                                  ["block_size", "prefix_caching_hash_algo", "enable_prefix_caching"],
                                  registry=r)

    def touch(self, labels: dict[str, str]) -> None:
        """Create every series at zero, as vLLM exports them before the first request."""
        for metric in (self.running, self.waiting, self.kv_usage, self.prompt_tokens,
                       self.prompt_tokens_cached, self.generation_tokens, self.prefix_queries,
                       self.prefix_hits, self.external_queries, self.external_hits,
                       self.preemptions, self.ttft, self.queue_time):
            metric.labels(**labels)

    def describe_cache(self, block_size: int) -> None:
        self.cache_config.labels(block_size=str(block_size), prefix_caching_hash_algo="xxh3_64",
                                 enable_prefix_caching="True").set(1)
