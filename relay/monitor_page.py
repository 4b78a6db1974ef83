"""``/``: the station on one HTML page a person reads at a glance; it reloads itself.

Rendered on the server from the /status document (no script, no outside resources); every
value shown is escaped.
"""

from __future__ import annotations

from html import escape
from typing import Any

REFRESH_S = 5

_STYLE = """
body{font:15px/1.4 system-ui,sans-serif;margin:1.5em;color:#222;background:#fafafa}
h1{font-size:1.3em;margin:0 0 .2em} .id{font-family:monospace;font-size:.85em;color:#555}
.tiles{display:flex;flex-wrap:wrap;gap:.8em;margin:1em 0}
.tile{background:#fff;border:1px solid #ddd;border-radius:6px;padding:.6em 1em;min-width:9em}
.tile b{display:block;font-size:1.6em} .ok{color:#176b1f} .bad{color:#a31515}
table{border-collapse:collapse;background:#fff;margin:.5em 0 1.5em}
td,th{border:1px solid #ddd;padding:.25em .6em;text-align:left;font-size:.9em}
td.n{text-align:right;font-variant-numeric:tabular-nums}
"""


def _tile(label: str, value: object, key: str) -> str:
    return (
        f'<div class="tile" id="{key}"><b data-figure="{key}">{escape(str(value))}</b>'
        f"{escape(label)}</div>"
    )


def _table(title: str, rows: list[tuple[str, object]]) -> str:
    if not rows:
        return f"<h2>{escape(title)}</h2><p>none</p>"
    body = "".join(
        f'<tr><td>{escape(name)}</td><td class="n">{escape(str(value))}</td></tr>'
        for name, value in rows
    )
    return f"<h2>{escape(title)}</h2><table>{body}</table>"


def _links_table(links: list[dict[str, Any]]) -> str:
    if not links:
        return "<h2>Links</h2><p>none</p>"
    head = "<tr><th>node id</th><th>address</th><th>state</th><th>linked</th><th>age s</th></tr>"
    body = "".join(
        f"<tr><td class=id>{escape(link['node_id'][:16])}…</td><td>{escape(link['address'])}</td>"
        f"<td>{escape(link['state'])}</td><td>{link['linked']}</td>"
        f'<td class="n">{link["age_s"]}</td></tr>'
        for link in links
    )
    return f"<h2>Links</h2><table>{head}{body}</table>"


def render(status: dict[str, Any], links: list[dict[str, Any]]) -> bytes:
    connections, dht, stores = status["connections"], status["dht"], status["stores"]
    health = "draining" if status["draining"] else ("serving" if status["ready"] else "starting")
    tiles = "".join(
        [
            _tile("clients", connections["clients"], "clients"),
            _tile("subscriptions", status["subscriptions"], "subscriptions"),
            _tile("advertisements", status["advertisements"], "advertisements"),
            _tile("links up", status["links"]["up"], "links"),
            _tile("pending calls", status["pending_calls"], "pending_calls"),
            _tile("paused publishers", status["paused_publishers"], "paused_publishers"),
            _tile("slow consumers closed", status["slow_consumers_closed"], "slow_consumers"),
            _tile("refusals", sum(status["refusals"].values()), "refusals"),
        ]
    )
    store_rows = [
        ("DHT records", dht["records"]),
        ("DHT bytes", dht["bytes"]),
        ("record store rows", stores["record_store_rows"]),
        ("content bytes", stores["content_bytes"]),
        ("history rows", stores["history_rows"]),
    ]
    page = (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        f'<meta http-equiv="refresh" content="{REFRESH_S}">'
        f"<title>macula station {escape(status['node_id'][:16])}</title><style>{_STYLE}</style>"
        "</head><body>"
        f"<h1>macula station <span class={'ok' if health == 'serving' else 'bad'}>"
        f"{health}</span></h1>"
        f'<div class="id" id="node_id">{escape(status["node_id"])}</div>'
        f"<div>{escape(status['endpoint'])} · version {escape(status['version'])} · "
        f"up {int(status['uptime_s'])} s · {connections['total']} connections of "
        f"{connections['max']}</div>"
        f'<div class="tiles">{tiles}</div>'
        f"{_links_table(links)}"
        f"{_table('Stores', store_rows)}"
        f"{_table('Refusals', list(status['refusals'].items()))}"
        "</body></html>"
    )
    return page.encode()
