"""The status page in a real headless Chromium (Debian's ``chromium``, driven by playwright):
it shows the station's node id and its client count, and the count moves on its next reload;
it lists the connected clients (node id prefix, petname, address) a page at a time.
Skipped, saying why, when /usr/bin/chromium is absent (``.ci/run`` installs it with apt-get)."""

from __future__ import annotations

import os

import pytest

from macula.agent.petnames import petname
from macula.node.node import Node
from relay.station.station import Station
from support.consolekit import ARGS, CHROMIUM
from support.identities import new_identity
from support.monitorkit import monitor_on

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} absent (apt chromium)"),
]


async def test_the_page_shows_node_id_and_clients(station: Station) -> None:
    from playwright.async_api import async_playwright

    async with (
        monitor_on(station) as monitor,
        async_playwright() as playwright,
    ):
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = await browser.new_page()
            url = "http://{}:{}/".format(*monitor.address)
            await page.goto(url)
            assert await page.text_content("#node_id") == station.node_id.hex()
            assert await page.text_content('[data-figure="clients"]') == "0"
            assert "macula station" in await page.title()
            async with Node(new_identity(), [station.endpoint]) as alice:
                await alice.flush()
                await page.reload()
                assert await page.text_content('[data-figure="clients"]') == "1"
        finally:
            await browser.close()


async def test_the_page_lists_connected_clients_and_pages_through_them(station: Station) -> None:
    from playwright.async_api import async_playwright

    async with (
        monitor_on(station, clients_per_page=1) as monitor,
        Node(new_identity(), [station.endpoint]) as alice,
        Node(new_identity(), [station.endpoint]) as bob,
        async_playwright() as playwright,
    ):
        await alice.flush()
        await bob.flush()
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = await browser.new_page()
            await page.goto("http://{}:{}/".format(*monitor.address))
            shown = []
            for _ in range(2):
                [row] = await page.locator("#clients tr[data-client]").all()
                node = bytes.fromhex(await row.get_attribute("data-client") or "")
                text = await row.text_content() or ""
                assert petname(node) in text and node.hex()[:16] in text and "127.0.0.1" in text
                shown.append(node)
                if len(shown) == 1:
                    await page.click("#next")
            assert sorted(shown) == sorted([alice.identity.node_id, bob.identity.node_id])
            assert await page.locator("#next").count() == 0
            assert await page.text_content("#clients-shown") == "2 to 2 of 2"
        finally:
            await browser.close()
