"""docs/deploy.md's table of metrics ("Metrics") against what a running app's GET /metrics
exports: every series in the table and nothing else, with its type, labels and label values;
and every metric name the README, docs/ and deploy/ mention is one of them. Before the table,
the README named seven of the seventeen, and neither the lateness histogram's `attempt` label
nor timewheel_callback_duration_seconds, timewheel_claims_dropped_total,
timewheel_tasks_cancelled_total or timewheel_ticks_total was documented anywhere."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from timewheel.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
FLOW = "partner-api"
# `timewheel_...` words in the docs that are no metric: redis-py's lib-name of the service's
# connections (docs/security.md, README), and a heading's anchor (`#...-timewheel_buckets`).
NOT_METRICS = re.compile(r"timewheel_v\b|-timewheel_buckets")


def documented() -> dict[str, tuple[str, dict[str, list[str]]]]:
    """docs/deploy.md's table: name -> (type, {label: its values, [] when not enumerated})."""
    text = (ROOT / "docs" / "deploy.md").read_text()
    section = text.split("\n## Metrics\n", 1)[1].split("\n## ", 1)[0]
    table: dict[str, tuple[str, dict[str, list[str]]]] = {}
    for line in section.splitlines():
        if not line.startswith("| `timewheel_"):
            continue
        name, kind, labels = (cell.strip() for cell in line.strip("|").split("|")[:3])
        by_label = {}
        if labels:
            label, _, values = labels.partition(":")
            by_label[label.strip("`")] = re.findall(r"`([^`]+)`", values)
        table[name.strip("`")] = (kind, by_label)
    return table


async def scrape(make_client: Callable[..., Any], settings: Settings
                 ) -> dict[str, tuple[str, dict[str, set[str]]]]:
    """GET /metrics of an app with one configured flow (the per-flow series are shown for
    those only): exported name (a counter's with `_total`) -> (type, {label: values seen})."""
    async with make_client(settings) as client:
        assert (await client.put(f"/flows/{FLOW}", json={"parallelism": 5})).status_code == 200
        response = await client.get("/metrics")
    assert response.status_code == 200
    exported: dict[str, tuple[str, dict[str, set[str]]]] = {}
    for family in text_string_to_metric_families(response.text):
        name = family.name + "_total" if family.type == "counter" else family.name
        labels: dict[str, set[str]] = {}
        for sample in family.samples:
            for label, value in sample.labels.items():
                if label != "le":  # a histogram's bucket bound
                    labels.setdefault(label, set()).add(value)
        exported[name] = (family.type, labels)
    return exported


async def test_the_metrics_table_is_what_metrics_exports(
        make_client: Callable[..., Any], settings: Settings) -> None:
    table = documented()
    exported = await scrape(make_client, settings)
    # The client library's `<name>_created` series, which the text below the table explains.
    created = {name for name in exported if name.endswith("_created")}
    assert {name.removesuffix("_created") for name in created} == {
        name.removesuffix("_total") for name, (kind, _) in table.items()
        if kind in ("counter", "histogram")}
    assert sorted(table) == sorted(set(exported) - created)
    for name, (kind, labels) in table.items():
        seen_kind, seen_labels = exported[name]
        assert kind == seen_kind, name
        assert set(labels) == set(seen_labels), name
        for label, values in labels.items():
            assert set(values or [FLOW]) == seen_labels[label], (name, label)


def test_every_metric_the_docs_name_exists() -> None:
    names = set(documented())
    # A histogram's series: <name>_bucket, _count, _sum; a counter's or histogram's _created.
    series = names | {f"{name.removesuffix('_total')}{suffix}" for name in names
                      for suffix in ("_bucket", "_count", "_sum", "_created")}
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
             *sorted(path for path in (ROOT / "deploy").rglob("*") if path.is_file())]
    for path in files:
        text = NOT_METRICS.sub("", path.read_text())
        for mentioned in re.findall(r"timewheel_[a-z_]+[a-z]", text):
            assert mentioned in series, f"{path.relative_to(ROOT)}: {mentioned}"
