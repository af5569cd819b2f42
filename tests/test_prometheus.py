"""Our Prometheus text exposition, checked against prometheus-client: the same
operations on both give the same samples through prometheus-client's own parser."""

from __future__ import annotations

import threading

import prometheus_client as pc
import pytest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families

from dra_driver import prometheus as prom

BUCKETS = (0.001, 0.01, 0.1, 1, 10)


def samples(text: str) -> dict[tuple[str, str, tuple[tuple[str, str], ...]], float]:
    """(family type, sample name, labels) -> value; prometheus-client's ``_created``
    samples (a separate gauge family in this format) are left out."""
    return {
        (fam.type, s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if not s.name.endswith("_created")
    }


def both(build) -> tuple[str, str]:
    ours, theirs = prom.Registry(), pc.CollectorRegistry()
    build(prom, ours)
    build(pc, theirs)
    return ours.render().decode(), pc.generate_latest(theirs).decode()


def test_counters_gauges_and_histograms_scrape_the_same_as_prometheus_client() -> None:
    def build(lib, registry) -> None:
        writes = lib.Counter("t_writes", "Writes.", ["operation"], registry=registry)
        writes.labels("create").inc()
        writes.labels("update").inc(2.5)
        writes.labels("delete")  # created, never counted: a 0 sample
        lib.Counter("t_conflicts_total", "Conflicts.", registry=registry).inc()
        lib.Gauge("t_generation", "Generation.", registry=registry).set(7)
        h = lib.Histogram("t_seconds", "Duration.", ["op"], buckets=BUCKETS, registry=registry)
        for v in (0.0005, 0.001, 0.05, 0.05, 3, 99):
            h.labels("prepare").observe(v)
        plain = lib.Histogram("t_sync_seconds", "Sync.", buckets=BUCKETS, registry=registry)
        plain.observe(0.2)

    ours, theirs = both(build)
    assert samples(ours) == samples(theirs)
    got = samples(ours)
    # le is inclusive and buckets cumulative: 0.0005 and 0.001 both in le="0.001"
    assert got[("histogram", "t_seconds_bucket", (("le", "0.001"), ("op", "prepare")))] == 2
    assert got[("histogram", "t_seconds_bucket", (("le", "+Inf"), ("op", "prepare")))] == 6
    assert got[("histogram", "t_seconds_sum", (("op", "prepare"),))] == pytest.approx(102.1015)
    assert got[("counter", "t_writes_total", (("operation", "delete"),))] == 0


def test_scrape_time_families_scrape_the_same_as_prometheus_client() -> None:
    class Ours:
        def collect(self):
            g = prom.gauge_family("t_healthy", "Healthy.", labels=["device"])
            g.add_metric(["gpu-0"], 1)
            g.add_metric(["gpu-1"], 0)
            c = prom.counter_family("t_rounds", "Rounds.")
            c.add_metric([], 12)
            yield from (g, c)

    class Theirs:
        def collect(self):
            g = GaugeMetricFamily("t_healthy", "Healthy.", labels=["device"])
            g.add_metric(["gpu-0"], 1)
            g.add_metric(["gpu-1"], 0)
            c = CounterMetricFamily("t_rounds", "Rounds.")
            c.add_metric([], 12)
            yield from (g, c)

    ours, theirs = prom.Registry(), pc.CollectorRegistry()
    ours.register(Ours())
    theirs.register(Theirs())
    assert samples(ours.render().decode()) == samples(pc.generate_latest(theirs).decode())
    assert ours.get_sample_value("t_healthy", {"device": "gpu-1"}) == 0
    assert ours.get_sample_value("t_rounds_total") == 12
    assert ours.get_sample_value("t_rounds_total", {"device": "gpu-1"}) is None


def test_label_values_and_help_are_escaped() -> None:
    nasty = 'a "quoted" back\\slash\nnewline'

    def build(lib, registry) -> None:
        c = lib.Counter("t_odd", 'Help with a \\ and\na newline "quoted".', ["v"],
                        registry=registry)  # fmt: skip
        c.labels(nasty).inc()

    ours, theirs = both(build)
    assert samples(ours) == samples(theirs)
    [fam] = text_string_to_metric_families(ours)
    assert fam.documentation == 'Help with a \\ and\na newline "quoted".'
    assert fam.samples[0].labels == {"v": nasty}


def test_special_values_render_as_the_format_spells_them() -> None:
    registry = prom.Registry()
    fam = prom.gauge_family("t_special", "Special.", labels=["k"])
    for k, v in (("inf", float("inf")), ("ninf", float("-inf")), ("nan", float("nan"))):
        fam.add_metric([k], v)

    class One:
        def collect(self):
            yield fam

    registry.register(One())
    text = registry.render().decode()
    assert 't_special{k="inf"} +Inf' in text and 't_special{k="ninf"} -Inf' in text
    assert 't_special{k="nan"} NaN' in text
    assert prom.Registry().render() == b""


def test_bad_names_labels_buckets_and_values_are_refused() -> None:
    registry = prom.Registry()
    with pytest.raises(ValueError, match="invalid metric name 't-x'"):
        prom.Counter("t-x", "x", registry=registry)
    with pytest.raises(ValueError, match="invalid label name '__x'"):
        prom.Counter("t_x", "x", ["__x"], registry=registry)
    with pytest.raises(ValueError, match="finite, distinct and ascending"):
        prom.Histogram("t_h", "h", buckets=(1, 0.5), registry=registry)
    with pytest.raises(ValueError, match="'le' is the bucket label"):
        prom.Histogram("t_h", "h", ["le"], buckets=(1,), registry=registry)
    counter = prom.Counter("t_c", "c", ["a", "b"], registry=registry)
    with pytest.raises(ValueError, match="1 label values for labels"):
        counter.labels("only-one")
    with pytest.raises(ValueError, match="only goes up"):
        counter.labels("x", "y").inc(-1)
    with pytest.raises(ValueError, match="t_c is already registered"):
        prom.Gauge("t_c", "again", registry=registry)
    with pytest.raises(ValueError, match="1 label values"):
        prom.gauge_family("t_f", "f", labels=["a", "b"]).add_metric(["x"], 1)


def test_concurrent_updates_are_not_lost() -> None:
    registry = prom.Registry()
    counter = prom.Counter("t_n", "n", ["t"], registry=registry)
    hist = prom.Histogram("t_h", "h", buckets=(0.5,), registry=registry)

    def work() -> None:
        for _ in range(5000):
            counter.labels("x").inc()
            hist.observe(1.0)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert registry.get_sample_value("t_n_total", {"t": "x"}) == 40000
    assert registry.get_sample_value("t_h_count") == 40000
    assert registry.get_sample_value("t_h_sum") == 40000
