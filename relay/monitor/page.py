"""``/``: the station on one HTML page a person reads at a glance; it reloads itself.

Rendered on the server from the /status document (no script, no outside resources); every
value shown is escaped. Connected clients are listed ``CLIENTS_PER_PAGE`` at a time (``/?page=N``,
with previous/next links), so the page stays small however many clients there are.
"""

from __future__ import annotations

from datetime import UTC, datetime
from html import escape
from typing import Any, Final

REFRESH_S: Final = 5
CLIENTS_PER_PAGE: Final = 50
MAX_PAGE_NUMBER: Final = 1_000_000

_STYLE = """
body{font:15px/1.4 system-ui,sans-serif;margin:1.5em;color:#222;background:#fafafa}
h1{font-size:1.3em;margin:0 0 .2em} .id{font-family:monospace;font-size:.85em;color:#555}
.tiles{display:flex;flex-wrap:wrap;gap:.8em;margin:1em 0}
.tile{background:#fff;border:1px solid #ddd;border-radius:6px;padding:.6em 1em;min-width:9em}
.tile b{display:block;font-size:1.6em} .ok{color:#176b1f} .bad{color:#a31515}
table{border-collapse:collapse;background:#fff;margin:.5em 0 1.5em}
td,th{border:1px solid #ddd;padding:.25em .6em;text-align:left;font-size:.9em}
td.n{text-align:right;font-variant-numeric:tabular-nums}
nav.pages a{margin-right:1em}
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


def _since(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _client_row(row: dict[str, Any]) -> str:
    node = row["node_id"]
    shown = f"{escape(node[:16])}…" if node else "(not yet announced)"
    return (
        f'<tr data-client="{escape(node)}"><td class=id>{shown}</td>'
        f"<td>{escape(row['petname'] or '')}</td><td>{escape(row.get('operator_name') or '')}</td>"
        f"<td>{escape(row['address'] or '')}</td>"
        f"<td>{escape(row['state'])}</td><td>{_since(row['since_ms'])}</td>"
        f'<td class="n">{row["age_s"]}</td></tr>'
    )


def _clients_table(clients: dict[str, Any], page: int) -> str:
    """One page of connected clients, with links to the pages before and after it."""
    total, offset, rows = clients["total"], clients["offset"], clients["connections"]
    title = f"<h2>Clients ({total})</h2>"
    if not rows:
        back = '<p><a href="/">first page</a></p>' if total else ""
        return f"{title}<p>none{' on this page' if total else ''}</p>{back}"
    head = (
        "<tr><th>node id</th><th>petname</th><th>operator</th><th>address</th><th>state</th>"
        "<th>since</th><th>age s</th></tr>"
    )
    body = "".join(_client_row(row) for row in rows)
    links = [f'<a id="previous" href="/?page={page - 1}">previous</a>'] if page > 1 else []
    if clients["next_offset"] is not None:
        links.append(f'<a id="next" href="/?page={page + 1}">next</a>')
    shown = f"{offset + 1} to {offset + len(rows)} of {total}"
    nav = f'<nav class="pages"><span id="clients-shown">{shown}</span> {" ".join(links)}</nav>'
    return f'{title}<table id="clients">{head}{body}</table>{nav}'


def render(
    status: dict[str, Any],
    links: list[dict[str, Any]],
    clients: dict[str, Any] | None = None,
    page_number: int = 1,
) -> bytes:
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
        f"{_clients_table(clients, page_number) if clients is not None else ''}"
        f"{_links_table(links)}"
        f"{_table('Stores', store_rows)}"
        f"{_table('Refusals', list(status['refusals'].items()))}"
        "</body></html>"
    )
    return page.encode()
