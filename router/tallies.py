"""Counters and histograms for the request path: plain numbers, turned into metric
families only when scraped.

prometheus_client's ``Counter`` and ``Histogram`` take a lock on every increment (two per
observation: the bucket and the sum) and find a histogram's bucket by a linear scan; the
router's per-request metrics cost 6.7 us a request that way in a tight loop. The router
records them on its event loop's thread and serves ``/metrics`` from that same loop, so
the locks guard nothing. Here:

- ``Tally``: a labelled counter, one float per label values;
- ``Spread``: a labelled histogram, per label values a list of per-bucket counts (the
  bucket found by ``bisect``: an observation equal to a bound falls in that bound's
  bucket, as Prometheus' ``le`` says) and a sum;
- ``TallyCollector``: a prometheus_client collector rendering them at scrape time as the
  client's own ``Counter``/``Histogram`` would (``NAME_total``; cumulative
  ``NAME_bucket{le=...}``, ``NAME_count``, ``NAME_sum``), without the ``_created``
  series.

Record only from the event loop's thread (nothing here is locked).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString


class Tally:
    """A counter with labels: ``tally.add(values)`` counts one for those label values
    (any objects; exported as ``str(value)``, as the client's ``labels()`` does)."""

    def __init__(self, name: str, doc: str, labels: Sequence[str]):
        self.name, self.doc, self.labels = name, doc, tuple(labels)
        self.counts: dict[tuple[object, ...], float] = {}  # label values as given

    def add(self, values: tuple[object, ...], amount: float = 1.0) -> None:
        counts = self.counts
        counts[values] = counts.get(values, 0.0) + amount

    def family(self) -> Metric:
        out = CounterMetricFamily(self.name, self.doc, labels=self.labels)
        for values, count in self.counts.items():
            out.add_metric([str(v) for v in values], count)
        return out


class Spread:
    """A histogram with labels over fixed upper bounds (``+Inf`` added)."""

    def __init__(self, name: str, doc: str, labels: Sequence[str], bounds: Sequence[float]):
        self.name, self.doc, self.labels = name, doc, tuple(labels)
        self.bounds = tuple(sorted(bounds))
        self._le = [floatToGoString(b) for b in self.bounds] + ["+Inf"]  # type: ignore[no-untyped-call]
        # label values -> [count per bucket (the last: above every bound)..., sum]
        self.cells: dict[tuple[object, ...], list[float]] = {}

    def observe(self, values: tuple[object, ...], amount: float) -> None:
        cell = self.cells.get(values)
        if cell is None:
            cell = self.cells[values] = [0.0] * (len(self.bounds) + 2)
        cell[bisect_left(self.bounds, amount)] += 1
        cell[-1] += amount

    def family(self) -> Metric:
        out = HistogramMetricFamily(self.name, self.doc, labels=self.labels)
        for values, cell in self.cells.items():
            running, buckets = 0.0, []
            for le, count in zip(self._le, cell[:-1], strict=True):
                running += count
                buckets.append((le, running))
            out.add_metric([str(v) for v in values], buckets, cell[-1])
        return out


class TallyCollector(Collector):
    """Exports ``Tally`` and ``Spread`` instruments through a prometheus_client registry."""

    def __init__(self, instruments: Sequence[Tally | Spread]):
        self.instruments = list(instruments)

    def collect(self) -> Iterator[Metric]:
        for instrument in self.instruments:
            yield instrument.family()
