"""router.tallies renders what prometheus_client's own Counter and Histogram render for
the same observations (values on, between and beyond the bounds; several label values)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from router.tallies import Spread, Tally, TallyCollector

BOUNDS = (0.001, 0.01, 0.1, 1.0, 30.0)
SAMPLES = [("a", 200, 0.001), ("a", 200, 0.0005), ("b", 503, 0.01), ("a", 200, 0.5),
           ("b", 503, 31.0), ("a", 200, 1.0), ("b", 200, 0.0), ("a", 200, 29.999)]


def _series(text: bytes) -> set[str]:
    """Sample lines, without the client's ``_created`` series and comments."""
    return {line for line in text.decode().splitlines()
            if line and not line.startswith("#") and "_created" not in line}


def test_exposition_matches_prometheus_client() -> None:
    theirs = CollectorRegistry()
    counter = Counter("x_requests", "requests", ["replica", "status"], registry=theirs)
    hist = Histogram("x_seconds", "seconds", ["replica"], buckets=BOUNDS, registry=theirs)
    plain = Histogram("x_overhead", "overhead", buckets=BOUNDS, registry=theirs)

    ours = CollectorRegistry()
    tally = Tally("x_requests", "requests", ["replica", "status"])
    spread = Spread("x_seconds", "seconds", ["replica"], BOUNDS)
    unlabelled = Spread("x_overhead", "overhead", [], BOUNDS)
    ours.register(TallyCollector([tally, spread, unlabelled]))

    for replica, status, seconds in SAMPLES:
        counter.labels(replica, status).inc()
        hist.labels(replica).observe(seconds)
        plain.observe(seconds * 2)
        tally.add((replica, status))
        spread.observe((replica,), seconds)
        unlabelled.observe((), seconds * 2)

    expected = _series(generate_latest(theirs))
    assert 'x_seconds_bucket{le="0.001",replica="a"} 2.0' in expected  # on the bound: in it
    assert _series(generate_latest(ours)) == expected
