"""Views for the load-and-affinity policy tests: replicas by load, a request by GPU residency."""

from __future__ import annotations

from policies.base import ReplicaView, RequestView, Residency


def replicas(*loads: float) -> list[ReplicaView]:
    return [ReplicaView(id=f"r{i}", url=f"http://r{i}", in_flight=int(x)) for i, x in enumerate(loads)]


def request(
    gpu: dict[str, int] | None = None,
    prompt_tokens: int = 1000,
    session: str = "s",
    exclude: frozenset[str] = frozenset(),
) -> RequestView:
    # 10 blocks of 100 tokens: one block is 10% of the prompt.
    residency = Residency(chain_blocks=10, block_tokens=100, gpu=gpu or {}, pool=10)
    return RequestView(request_id="q", model="m", session=session, prompt_tokens=prompt_tokens,
                       residency=residency, exclude=exclude)
