"""What a copy of a prefix is worth to its other readers (``policies.locality``).

A replica that does not hold a request's prefix can serve it only by computing the prefix
again (or loading it from the pool): a copy. ``locality`` charges a copy its extra work,
shared by the prefix's readers in flight (``Residency.readers``). The copy also serves the
prefix's later readers, who would otherwise queue at its holder; that is this module.

Each reader in flight (the prefix's demand now) stands for one to come, who saves about
half the difference of the two waits. So a candidate ``r`` holding less of the prompt than
the most any candidate holds, and waiting less than the best of those holders, scores
lower by

    weight * readers * (holder's wait - wait(r)) / 2 / (1 + mean q)

where ``mean q`` is the candidates' mean wait in mean service times (``locality``'s
load-aware count, ``q(r)``): a fleet with queues everywhere has no spare time for a copy
to use, and a copy made there is paid by everyone queued. The score never goes lower
than r's as a holder: its wait plus the holder's service, with the same load-aware
charge. A session's own context has no other readers, so its moves are priced as before.
``locality`` counts the benefit only once calibration's warm-up has ended
(``benefit_after_warmup``), and then times the model's trust, ``1 - error bound /
log(clip)`` (``benefit_trust``): the benefit multiplies the model's error by the readers,
and before its first replies the model is the prior.

Why: without it, with no pool a hot document was copied only once its holder's queue was
longer than the copy's own prefill (the gauntlet's ``docqa`` without a pool: copies at
36-70 s, where ``load_aware`` copied at once, and p90 TTFT 1.19x the best other policy's
at half the knee; docs/locality.md).
"""

from __future__ import annotations

from policies.cost import Estimate


def apply(scores: dict[str, float], estimates: dict[str, Estimate], readers: int, *,
          weight: float, work_weight: float, mean_service: float) -> None:
    """Lower, in place, the ``scores`` of the candidates a copy would make holders.
    ``estimates``: the candidates' (keyed as ``scores``); ``readers``: the prefix's
    readers in flight; ``weight``: the benefit's weight (``copy_benefit``);
    ``work_weight`` and ``mean_service``: ``locality``'s load-aware charge."""
    if not readers or weight <= 0:
        return
    cached = [e.gpu_tokens + e.pool_tokens for e in estimates.values()]
    most = max(cached)
    if min(cached) == most:  # every candidate holds it: no copy to price (the common case)
        return
    holders = [e for e in estimates.values() if e.gpu_tokens + e.pool_tokens == most]
    hold_wait = min(e.wait_s for e in holders)
    hold_service = min(e.load_s + e.prefill_s for e in holders)
    per_service = 1 / mean_service if mean_service > 0 else 0.0
    mean_q = sum(e.wait_s for e in estimates.values()) * per_service / len(estimates)
    for rid, e in estimates.items():
        if e.gpu_tokens + e.pool_tokens == most or e.wait_s >= hold_wait:
            continue
        as_holder = e.wait_s + hold_service * (1 + work_weight * e.wait_s * per_service)
        gain = weight * readers * (hold_wait - e.wait_s) / 2 / (1 + mean_q)
        scores[rid] = max(min(as_holder, scores[rid]), scores[rid] - gain)
