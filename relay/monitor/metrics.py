"""``/metrics``: the /status figures in Prometheus text format (``prometheus-client``).

A custom collector turns one status document (read from the station when the scrape comes,
``relay.monitor.figures.status``) into metric families; nothing is counted per frame for it.
Names: ``macula_`` then the figure; counters end in ``_total``; every refusal counter is one
family, ``macula_refusals_total{reason=...}``, every core counter ``macula_events_total{name=...}``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_GAUGES = (  # (metric name, path in the status document, help)
    ("macula_uptime_seconds", ("uptime_s",), "seconds since the station started"),
    ("macula_ready", ("ready",), "1 once the station listens and serves"),
    ("macula_draining", ("draining",), "1 while the station is stopping"),
    ("macula_clients", ("connections", "clients"), "client connections past their CONNECT"),
    (
        "macula_connections_handshaking",
        ("connections", "handshaking"),
        "connections not yet past CONNECT",
    ),
    ("macula_connections", ("connections", "total"), "open connections, clients and links"),
    ("macula_connections_max", ("connections", "max"), "the --max-connections cap"),
    ("macula_subscriptions", ("subscriptions",), "subscriptions held (node, realm, topic)"),
    ("macula_advertisements", ("advertisements",), "procedures advertised"),
    ("macula_pending_calls", ("pending_calls",), "calls forwarded, waiting for a reply"),
    ("macula_paused_publishers", ("paused_publishers",), "publishers paused now (over the rate)"),
    ("macula_links_up", ("links", "up"), "station links up"),
    ("macula_link_connections", ("links", "connections"), "station connections, up or not yet"),
    ("macula_dht_records", ("dht", "records"), "DHT records held for the mesh"),
    ("macula_dht_bytes", ("dht", "bytes"), "bytes of those"),
    ("macula_dht_contacts", ("dht", "contacts"), "stations in the DHT routing table"),
    ("macula_record_store_rows", ("stores", "record_store_rows"), "rows in the record store"),
    ("macula_content_bytes", ("stores", "content_bytes"), "bytes of content held"),
    ("macula_content_blocks", ("stores", "content_blocks"), "content blocks held"),
    ("macula_history_rows", ("stores", "history_rows"), "room history events kept"),
    ("macula_monitor_clients", ("monitor", "clients"), "monitor connections open now"),
)
_COUNTERS = (
    ("macula_publishers_paused", ("publishers_paused_total",), "publishers paused (over the rate)"),
    (
        "macula_slow_consumers_closed",
        ("slow_consumers_closed",),
        "clients closed as slow consumers",
    ),
    ("macula_links_paused", ("links", "paused_total"), "links paused (over the EVENT rate)"),
    ("macula_monitor_requests", ("monitor", "requests"), "monitor requests served"),
    ("macula_monitor_timed_out", ("monitor", "timed_out"), "monitor clients timed out"),
)


def _at(document: dict[str, Any], path: tuple[str, ...]) -> float:
    value: Any = document
    for part in path:
        if not isinstance(value, dict) or part not in value:
            return 0.0
        value = value[part]
    return float(value) if isinstance(value, (int, float)) else 0.0


class StatusCollector(Collector):
    """Metric families of one status document."""

    def __init__(self, document: dict[str, Any]) -> None:
        self.document = document

    def collect(self) -> Iterator[Metric]:
        document = self.document
        info = GaugeMetricFamily(
            "macula_station_info",
            "the station's version and node id",
            labels=["version", "node_id"],
        )
        info.add_metric([str(document.get("version", "")), str(document.get("node_id", ""))], 1)
        yield info
        for name, path, text in _GAUGES:
            yield GaugeMetricFamily(name, text, value=_at(document, path))
        for name, path, text in _COUNTERS:
            yield CounterMetricFamily(name, text, value=_at(document, path))
        refused = CounterMetricFamily(
            "macula_refusals", "frames, connections and calls refused, by reason", labels=["reason"]
        )
        for reason, value in sorted(document.get("refusals", {}).items()):
            refused.add_metric([reason], float(value))
        yield refused
        counted = CounterMetricFamily(
            "macula_events", "the router's counters (docs/operations.md)", labels=["name"]
        )
        for counter, value in sorted(document.get("counters", {}).items()):
            counted.add_metric([counter], float(value))
        yield counted


def render(document: dict[str, Any]) -> bytes:
    """The Prometheus text exposition of ``document``."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StatusCollector(document))
    return generate_latest(registry)
