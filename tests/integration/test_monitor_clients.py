"""The status page's list of connected clients over a real station (real QUIC on loopback):
each client's node id prefix, petname, address and since; a page at a time, with a next link,
and never more than the page size however many clients are connected."""

from __future__ import annotations

import re
from contextlib import AsyncExitStack

import pytest

from macula.agent.petnames import petname
from macula.node.node import Node
from macula.services.house_client import HouseClient
from relay.station.station import Station
from support.identities import new_identity
from support.monitorkit import get, get_json, monitor_on

pytestmark = pytest.mark.anyio

CLIENTS = 5
PER_PAGE = 2


def rows(html: str) -> list[str]:
    return re.findall(r'<tr data-client="([0-9a-f]*)">', html)


async def page(address: tuple[str, int], path: str) -> str:
    status, headers, body = await get(address, path)
    assert status == 200 and headers["content-type"].startswith("text/html"), body
    return body.decode()


async def test_the_page_lists_clients_a_page_at_a_time(station: Station) -> None:
    async with AsyncExitStack() as stack, monitor_on(station, clients_per_page=PER_PAGE) as monitor:
        nodes = [
            await stack.enter_async_context(Node(new_identity(), [station.endpoint]))
            for _ in range(CLIENTS)
        ]
        for node in nodes:
            await node.flush()
        listed = await get_json(monitor.address, f"/connections?limit={CLIENTS}")
        assert {r["petname"] for r in listed["connections"]} == {
            petname(n.identity.node_id) for n in nodes
        }
        seen: list[str] = []
        path: str | None = "/"
        while path is not None:
            html = await page(monitor.address, path)
            shown = rows(html)
            assert 1 <= len(shown) <= PER_PAGE, html  # bounded: never the whole list
            seen += shown
            found = re.search(r'<a id="next" href="([^"]+)">', html)
            path = found.group(1) if found else None
        assert sorted(seen) == sorted(n.identity.node_id.hex() for n in nodes)
        assert len(seen) == CLIENTS

        first = await page(monitor.address, "/")
        at = first.index(f'<tr data-client="{rows(first)[0]}">')
        row = first[at : first.index("</tr>", at)]
        named = next(n.identity.node_id for n in nodes if n.identity.node_id.hex() in row)
        assert named.hex()[:16] + "…" in row and petname(named) in row
        assert "<td>127.0.0.1</td>" in row and " UTC</td>" in row  # its address, and since when
        assert 'id="previous"' not in first and f"Clients ({CLIENTS})" in first
        last = await page(monitor.address, f"/?page={-(-CLIENTS // PER_PAGE)}")
        assert 'id="next"' not in last and 'id="previous"' in last
        assert len(rows(last)) == CLIENTS - PER_PAGE * (CLIENTS // PER_PAGE)


@pytest.mark.parametrize("query", ["?page=999", "?page=0", "?page=-3", "?page=x", "?page="])
async def test_a_page_number_out_of_range_is_answered_not_refused(
    station: Station, query: str
) -> None:
    async with (
        monitor_on(station, clients_per_page=PER_PAGE) as monitor,
        Node(new_identity(), [station.endpoint]) as node,
    ):
        await node.flush()
        html = await page(monitor.address, "/" + query)
        if query == "?page=999":
            assert rows(html) == [] and "none on this page" in html
            assert '<a href="/">first page</a>' in html
        else:  # anything not a page number is the first page
            assert rows(html) == [node.identity.node_id.hex()]


async def test_a_client_listed_in_the_directory_shows_its_operator_name(station: Station) -> None:
    async with (
        monitor_on(station) as monitor,
        Node(new_identity(), [station.endpoint]) as listed,
        Node(new_identity(), [station.endpoint]) as quiet,
    ):
        await quiet.flush()
        entry = {"petname": petname(listed.identity.node_id), "operator_name": "Ann <ops>"}
        await HouseClient(listed, listed.dht, listed.identity).register_agent(entry)
        rows = (await get_json(monitor.address, "/connections"))["connections"]
        names = {r["node_id"]: r["operator_name"] for r in rows}
        assert names == {
            listed.identity.node_id.hex(): "Ann <ops>",
            quiet.identity.node_id.hex(): None,
        }
        html = await page(monitor.address, "/")
        assert "<td>Ann &lt;ops&gt;</td>" in html and "Ann <ops>" not in html
