"""The status page's client table (``relay.monitor.page``), pure: one page of rows however many
clients there are, links to the pages around it, every value escaped."""

from __future__ import annotations

from typing import Any

from relay.monitor.page import CLIENTS_PER_PAGE, render

STATUS: dict[str, Any] = {
    "node_id": "ab" * 32,
    "endpoint": "127.0.0.1:4433",
    "version": "0",
    "uptime_s": 1.0,
    "ready": 1,
    "draining": 0,
    "connections": {"clients": 0, "total": 0, "max": 10},
    "subscriptions": 0,
    "advertisements": 0,
    "links": {"up": 0},
    "pending_calls": 0,
    "paused_publishers": 0,
    "slow_consumers_closed": 0,
    "refusals": {},
    "dht": {"records": 0, "bytes": 0},
    "stores": {"record_store_rows": 0, "content_bytes": 0, "history_rows": 0},
}


def client(i: int, **extra: Any) -> dict[str, Any]:
    row = {"node_id": f"{i:064x}", "petname": f"pet_{i}", "address": "10.0.0.1",
           "state": "connected", "since_ms": 1_700_000_000_000, "age_s": 3}  # fmt: skip
    return row | extra


def clients_page(page: int, total: int) -> dict[str, Any]:
    offset = (page - 1) * CLIENTS_PER_PAGE
    count = max(0, min(CLIENTS_PER_PAGE, total - offset))
    following = offset + count if offset + count < total else None
    rows = [client(offset + i) for i in range(count)]
    return {"total": total, "offset": offset, "next_offset": following, "connections": rows}


def test_a_page_holds_one_page_of_a_hundred_thousand_clients() -> None:
    html = render(STATUS, [], clients_page(3, 100_000), 3).decode()
    assert html.count("<tr data-client=") == CLIENTS_PER_PAGE
    assert '<a id="previous" href="/?page=2">' in html and '<a id="next" href="/?page=4">' in html
    assert "101 to 150 of 100000" in html and "Clients (100000)" in html
    assert "2023-11-14 22:13:20 UTC" in html  # since, in UTC
    assert len(html) < 40_000


def test_the_last_page_has_no_next_and_an_empty_one_points_home() -> None:
    last = render(STATUS, [], clients_page(2, 60), 2).decode()
    assert last.count("<tr data-client=") == 10 and 'id="next"' not in last
    empty = render(STATUS, [], clients_page(9, 60), 9).decode()
    assert "none on this page" in empty and '<a href="/">first page</a>' in empty
    nobody = render(STATUS, [], clients_page(1, 0), 1).decode()
    assert "Clients (0)" in nobody and "first page" not in nobody


def test_values_are_escaped_and_a_client_not_yet_announced_has_no_petname() -> None:
    page = clients_page(1, 0) | {"total": 1}
    page["connections"] = [client(1, node_id="", petname=None, address="<b>x</b>")]
    html = render(STATUS, [], page, 1).decode()
    assert "(not yet announced)" in html and "&lt;b&gt;x&lt;/b&gt;" in html and "<b>x" not in html
