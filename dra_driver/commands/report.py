"""``dra-driver report``: claims whose GPUs stayed under-used, and what would have fit.

Reads the plugin's per-claim usage metrics (``dra_driver_claim_*``) over a
window, from one of:

- ``--prometheus URL``: a Prometheus server that scrapes the plugins
  (``/api/v1/query_range`` over ``--window``, every ``--step``);
- ``--scrape URL`` (repeatable): the plugins' ``/metrics`` endpoints, sampled
  every ``--interval`` for ``--duration`` (``--record FILE`` keeps the window);
- ``--recorded FILE``: a window recorded earlier with ``--record``.

Prints a table (default) or JSON; the analysis is
:func:`dra_driver.rightsizing.analyse`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.parse
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dra_driver.rightsizing import DeviceWindow, Finding


METRICS = (
    "dra_driver_claim_gpu_utilization_ratio",
    "dra_driver_claim_gpu_memory_used_bytes",
    "dra_driver_claim_gpu_memory_allocated_bytes",
    "dra_driver_claim_device_info",
)
Record = tuple[float, str, dict[str, str], float]
"""``(unix time, metric, labels, value)``."""


class ReportError(Exception):
    """A source cannot be read; the message says which and why."""


def add_sources(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup, *, required: bool
) -> None:
    """Where the usage metrics come from (also ``plan --from-cluster``'s)."""
    source = parser.add_mutually_exclusive_group(required=required)
    source.add_argument("--prometheus", metavar="URL", help="Prometheus server to query")
    source.add_argument(
        "--scrape", metavar="URL", action="append", help="a plugin's /metrics URL (repeatable)"
    )
    source.add_argument("--recorded", metavar="FILE", type=Path, help="window saved by --record")
    parser.add_argument("--window", type=float, default=3600, help="seconds back (--prometheus)")


def read_sources(args: argparse.Namespace, *, step: float, interval: float) -> list[Record] | None:
    """The records of the source :func:`add_sources` parsed (Prometheus queried at
    ``step``, plugins scraped every ``interval``); None when no source was given."""
    if args.prometheus:
        return query_prometheus(args.prometheus, args.window, step)
    if args.scrape:
        return scrape(args.scrape, args.duration, interval)
    if args.recorded:
        return read_recorded(args.recorded)
    return None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_sources(parser, required=True)
    parser.add_argument("--step", type=float, default=60, help="query step seconds (--prometheus)")
    parser.add_argument("--duration", type=float, default=300, help="seconds to sample (--scrape)")
    parser.add_argument("--interval", type=float, default=15, help="seconds between scrapes")
    parser.add_argument("--record", metavar="FILE", type=Path, help="save scraped samples here")
    parser.add_argument(
        "--threshold", type=float, default=0.3,
        help="under-used below this p95 utilization (memory fraction for MIG); default 0.3",
    )  # fmt: skip
    parser.add_argument(
        "--headroom", type=float, default=1.2, help="suggestions cover peak x this (default 1.2)"
    )
    parser.add_argument("-o", "--output", choices=("table", "json"), default="table")


def _get(url: str, timeout: float = 10.0) -> bytes:
    # Here: at module level it loaded ssl, http.client and email into every command,
    # the kubelet plugin's daemon included (the CLI imports all commands).
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 (user's URL)
            return bytes(resp.read())
    except (urllib.error.URLError, OSError) as exc:
        raise ReportError(f"cannot read {url}: {exc}") from exc


def parse_exposition(text: str, ts: float) -> list[Record]:
    """Our claim metrics from one Prometheus text scrape."""
    from prometheus_client.parser import text_string_to_metric_families

    return [
        (ts, s.name, dict(s.labels), float(s.value))
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name in METRICS
    ]


def scrape(urls: list[str], duration: float, interval: float) -> list[Record]:
    records: list[Record] = []
    end = time.monotonic() + duration
    while True:
        now = time.time()
        for url in urls:
            records += parse_exposition(_get(url).decode(), now)
        if time.monotonic() + interval > end:
            return records
        time.sleep(interval)


def query_prometheus(url: str, window: float, step: float) -> list[Record]:
    end = time.time()
    records: list[Record] = []
    for metric in METRICS:
        query = urllib.parse.urlencode(
            {"query": metric, "start": end - window, "end": end, "step": step}
        )
        body = json.loads(_get(f"{url.rstrip('/')}/api/v1/query_range?{query}"))
        if body.get("status") != "success":
            raise ReportError(f"Prometheus at {url} answered {body.get('error', body)}")
        for series in body["data"]["result"]:
            labels = {k: v for k, v in series["metric"].items() if k != "__name__"}
            records += [(float(t), metric, labels, float(v)) for t, v in series["values"]]
    return records


def read_recorded(path: Path) -> list[Record]:
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise ReportError(f"cannot read {path}: {exc}") from exc
    out: list[Record] = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
            out.append((float(r["ts"]), str(r["metric"]), dict(r["labels"]), float(r["value"])))
        except (ValueError, KeyError, TypeError) as exc:
            raise ReportError(f"{path}:{n}: not a recorded sample ({exc}): {line[:80]}") from exc
    return out


def write_recorded(path: Path, records: Iterable[Record]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w") as out:
        for ts, metric, labels, value in records:
            out.write(json.dumps({"ts": ts, "metric": metric, "labels": labels, "value": value}))
            out.write("\n")
    tmp.replace(path)


def windows(records: Iterable[Record]) -> list[DeviceWindow]:
    """Group samples per (namespace, claim, pod, device), in time order."""
    from dra_driver.rightsizing import DeviceWindow

    series: dict[tuple[str, str, str, str], dict[str, Any]] = {}
    for _ts, metric, labels, value in sorted(records, key=lambda r: r[0]):
        key = tuple(labels.get(k, "") for k in ("namespace", "claim", "pod", "device"))
        entry = series.setdefault(key, {"util": [], "mem": [], "alloc": 0, "info": {}})  # type: ignore[arg-type]
        if metric == METRICS[0]:
            entry["util"].append(value)
        elif metric == METRICS[1]:
            entry["mem"].append(int(value))
        elif metric == METRICS[2]:
            entry["alloc"] = int(value)
        else:
            entry["info"] = labels
    return [
        DeviceWindow(
            namespace=k[0],
            claim=k[1],
            pod=k[2],
            device=k[3],
            product=e["info"].get("product", ""),
            profile=e["info"].get("profile", ""),
            sharing=e["info"].get("sharing", "exclusive"),
            allocated_bytes=e["alloc"],
            utilization=tuple(e["util"]),
            memory_used=tuple(e["mem"]),
        )
        for k, e in sorted(series.items())
    ]


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v * 100:.0f}%"


def _gib(v: int) -> str:
    return f"{v / 2**30:.1f}Gi"


def table(findings: list[Finding]) -> str:
    head = ("NAMESPACE", "CLAIM", "POD", "DEVICE", "ALLOCATED", "UTIL p95/max", "MEMORY peak/alloc",
            "UNDER-USED", "WOULD FIT")  # fmt: skip
    rows = [head] + [
        (
            f.namespace,
            f.claim,
            f.pod,
            f.device,
            f.allocated,
            f"{_pct(f.utilization_p95)}/{_pct(f.utilization_max)}",
            f"{_gib(f.memory_peak_bytes)}/{_gib(f.memory_allocated_bytes)}",
            "yes" if f.under_used else "no",
            f.suggestion or "-",
        )
        for f in findings
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
    )


def run(args: argparse.Namespace) -> int:
    from dra_driver.rightsizing import analyse

    try:
        records = read_sources(args, step=args.step, interval=args.interval) or []
        if args.scrape and args.record:
            write_recorded(args.record, records)
    except ReportError as exc:
        print(f"dra-driver report: {exc}", file=sys.stderr)
        return 1
    found = windows(records)
    if not found:
        print(
            "dra-driver report: no dra_driver_claim_* samples in the window (are claims "
            "prepared, and is this a plugin's /metrics or a Prometheus that scrapes them?)",
            file=sys.stderr,
        )
        return 1
    findings = analyse(found, threshold=args.threshold, headroom=args.headroom)
    if args.output == "json":
        body = {
            "threshold": args.threshold,
            "headroom": args.headroom,
            "claims": [f.as_dict() for f in findings],
        }
        sys.stdout.write(json.dumps(body, indent=2) + "\n")
    else:
        sys.stdout.write(table(findings) + "\n")
    return 0
