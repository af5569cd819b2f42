"""Prometheus metrics of the daemon, rendered in the text exposition format 0.0.4.

Counters, gauges and histograms (with labels) live in a :class:`Registry` the
composition root creates and passes in; collectors add families read at scrape
time. Nothing is global.

Why not prometheus-client in the daemon: importing it loads its whole exposition
stack (``http.server``, ``urllib.request``, ``wsgiref``, ``email``, ``html``),
3.1 MB of the plugin's resident memory at rest on every GPU node, against an
idle-RSS target of 1.2x a Go plugin's (issue 11; README "Benchmarks"). What the
daemon needs of it is small and fixed by the format's specification: escaping,
float values, cumulative buckets. The tests parse what this module renders with
prometheus-client's own parser (a dependency still: ``dra-driver report`` reads
scrapes with it), so the two cannot drift apart.

Not rendered: the ``_created`` series prometheus-client adds to every counter and
histogram (creation timestamps as extra gauges; nothing here reads them), and
OpenMetrics: ``/metrics`` answers ``text/plain; version=0.0.4``.
"""

from __future__ import annotations

import bisect
import math
import re
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")


@dataclass
class Sample:
    name: str
    labels: dict[str, str]
    value: float


@dataclass
class Family:
    """One metric family as scraped: name, help, type and its samples."""

    name: str
    help: str
    type: str
    """``counter``, ``gauge`` or ``histogram``."""
    labels: Sequence[str] = ()
    samples: list[Sample] = field(default_factory=list)

    def add_metric(self, values: Sequence[str], value: float) -> None:
        """One sample of a counter or gauge family, label values in :attr:`labels` order."""
        if len(values) != len(self.labels):
            raise ValueError(f"{self.name}: {len(values)} label values for labels {self.labels}")
        suffix = "_total" if self.type == "counter" else ""
        labels = dict(zip(self.labels, (str(v) for v in values), strict=True))
        self.samples.append(Sample(self.name + suffix, labels, float(value)))


def gauge_family(name: str, help: str, labels: Sequence[str] = ()) -> Family:
    return Family(_checked(name, labels), help, "gauge", tuple(labels))


def counter_family(name: str, help: str, labels: Sequence[str] = ()) -> Family:
    """Samples are named ``<name>_total``; ``name`` is given without that suffix."""
    return Family(_checked(name, labels).removesuffix("_total"), help, "counter", tuple(labels))


class Collector(Protocol):
    def collect(self) -> Iterable[Family]: ...


class Registry:
    """The metrics and collectors one ``/metrics`` endpoint serves."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._collectors: list[Collector] = []
        self._names: set[str] = set()

    def register(self, collector: Collector, name: str | None = None) -> None:
        """``name``: a metric's own name, refused when registered twice."""
        with self._lock:
            if name is not None:
                if name in self._names:
                    raise ValueError(f"metric {name} is already registered")
                self._names.add(name)
            self._collectors.append(collector)

    def collect(self) -> Iterator[Family]:
        with self._lock:
            collectors = list(self._collectors)
        for collector in collectors:
            yield from collector.collect()

    def render(self) -> bytes:
        """Every family in the text exposition format."""
        lines: list[str] = []
        for fam in self.collect():
            # In this format a counter's HELP and TYPE name its samples: ``<name>_total``.
            name = fam.name + "_total" if fam.type == "counter" else fam.name
            lines.append(f"# HELP {name} {_escape_help(fam.help)}")
            lines.append(f"# TYPE {name} {fam.type}")
            for s in fam.samples:
                if s.labels:
                    labels = ",".join(f'{k}="{_escape_label(v)}"' for k, v in s.labels.items())
                    lines.append(f"{s.name}{{{labels}}} {_number(s.value)}")
                else:
                    lines.append(f"{s.name} {_number(s.value)}")
        return ("\n".join(lines) + "\n").encode() if lines else b""

    def get_sample_value(self, name: str, labels: Mapping[str, str] | None = None) -> float | None:
        """The value of one sample (tests, in-process checks), None when absent."""
        wanted = dict(labels or {})
        for fam in self.collect():
            for s in fam.samples:
                if s.name == name and s.labels == wanted:
                    return s.value
        return None


class _Metric:
    """Children per label values, created on first use; one lock per metric."""

    type = ""

    def __init__(
        self, name: str, help: str, labelnames: Sequence[str] = (), *, registry: Registry
    ) -> None:
        self.name = _checked(name, labelnames)
        self.help = help
        self.labelnames = tuple(labelnames)
        self._lock = threading.Lock()
        self._children: dict[tuple[str, ...], list[float]] = {}
        if not self.labelnames:
            self._children[()] = self._zero()
        registry.register(self, self.name)

    def _zero(self) -> list[float]:
        return [0.0]

    def _child(self, values: Sequence[object]) -> list[float]:
        if len(values) != len(self.labelnames):
            raise ValueError(
                f"{self.name}: {len(values)} label values for labels {self.labelnames}"
            )
        key = tuple(str(v) for v in values)
        child = self._children.get(key)
        if child is None:
            with self._lock:
                child = self._children.setdefault(key, self._zero())
        return child

    def collect(self) -> Iterator[Family]:
        """Counters and gauges: one value per child (histograms have their own)."""
        fam = Family(self.name, self.help, self.type, self.labelnames)
        for key, values in self._items():
            fam.add_metric(key, values[0])
        yield fam

    def _items(self) -> list[tuple[tuple[str, ...], list[float]]]:
        with self._lock:
            return [(key, list(values)) for key, values in self._children.items()]


class Counter(_Metric):
    """Exposed as ``<name>_total``; ``name`` is given without that suffix."""

    type = "counter"

    def __init__(
        self, name: str, help: str, labelnames: Sequence[str] = (), *, registry: Registry
    ) -> None:
        super().__init__(name.removesuffix("_total"), help, labelnames, registry=registry)

    def labels(self, *values: object) -> _CounterChild:
        return _CounterChild(self, self._child(values))

    def inc(self, amount: float = 1.0) -> None:
        _CounterChild(self, self._child(())).inc(amount)


class _Child:
    """One label combination's values, updated under its metric's lock."""

    __slots__ = ("_metric", "_values")

    def __init__(self, metric: _Metric, values: list[float]) -> None:
        self._metric, self._values = metric, values


class _CounterChild(_Child):
    __slots__ = ()

    def inc(self, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError(f"{self._metric.name}: a counter only goes up, not by {amount}")
        with self._metric._lock:
            self._values[0] += amount


class Gauge(_Metric):
    type = "gauge"

    def labels(self, *values: object) -> _GaugeChild:
        return _GaugeChild(self, self._child(values))

    def set(self, value: float) -> None:
        _GaugeChild(self, self._child(())).set(value)


class _GaugeChild(_Child):
    __slots__ = ()

    def set(self, value: float) -> None:
        with self._metric._lock:
            self._values[0] = float(value)


class Histogram(_Metric):
    """Cumulative ``_bucket`` samples (``le`` up to ``+Inf``), ``_sum`` and ``_count``."""

    type = "histogram"

    def __init__(
        self,
        name: str,
        help: str,
        labelnames: Sequence[str] = (),
        *,
        buckets: Sequence[float],
        registry: Registry,
    ) -> None:
        bounds = [float(b) for b in buckets]
        if not bounds or bounds != sorted(set(bounds)) or math.isinf(bounds[-1]):
            raise ValueError(f"{name}: buckets must be finite, distinct and ascending: {buckets}")
        if "le" in labelnames:
            raise ValueError(f"{name}: 'le' is the bucket label, not one of the metric's")
        self._bounds = bounds
        super().__init__(name, help, labelnames, registry=registry)

    def _zero(self) -> list[float]:
        # one count per bucket and +Inf (not cumulative), then the sum
        return [0.0] * (len(self._bounds) + 2)

    def labels(self, *values: object) -> _HistogramChild:
        return _HistogramChild(self, self._child(values))

    def observe(self, value: float) -> None:
        _HistogramChild(self, self._child(())).observe(value)

    def collect(self) -> Iterator[Family]:
        fam = Family(self.name, self.help, self.type, self.labelnames)
        les = [*(_number(b) for b in self._bounds), "+Inf"]
        for key, values in self._items():
            labels = dict(zip(self.labelnames, key, strict=True))
            total = 0.0
            for le, count in zip(les, values, strict=False):
                total += count
                fam.samples.append(Sample(self.name + "_bucket", {**labels, "le": le}, total))
            fam.samples.append(Sample(self.name + "_count", labels, total))
            fam.samples.append(Sample(self.name + "_sum", labels, values[-1]))
        yield fam


class _HistogramChild(_Child):
    __slots__ = ()
    _metric: Histogram

    def observe(self, value: float) -> None:
        i = bisect.bisect_left(self._metric._bounds, value)  # le: bound >= value
        with self._metric._lock:
            self._values[i] += 1
            self._values[-1] += value


def _checked(name: str, labels: Sequence[str]) -> str:
    if not _METRIC_NAME.match(name):
        raise ValueError(f"invalid metric name {name!r}: letters, digits, '_' and ':' only")
    for label in labels:
        if not _LABEL_NAME.match(label) or label.startswith("__"):
            raise ValueError(f"{name}: invalid label name {label!r}")
    return name


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def _escape_help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


def _escape_label(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
