"""The console's Audit tab in a real headless Chromium: a hosted agent's tool calls show with
their outcomes and digests (never their content), and the chain is said to verify.
Skipped, saying why, when /usr/bin/chromium is absent (``.ci/run`` installs it with apt-get)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from relay.station.station import Station
from support.consolekit import CHROMIUM, Home, agent, console

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} absent (apt chromium)"),
]


async def test_the_audit_tab_shows_each_call_and_a_verified_chain(
    station: Station, tmp_path: Path, browser: Any
) -> None:
    home = Home(tmp_path / "home")
    async with agent(home, station, "alice") as alice, console(home) as served:
        await alice.call("mesh_hello", message="a very private remark")
        await alice.call("mesh_rooms")
        page = await browser.new_page()
        await page.goto(served.url)
        await page.wait_for_selector('#feed[data-state="live"]')
        await page.click('#tabs button[data-tab="audit"]')
        trail = f'#audit-trails div[data-identity="{alice.node_id}"]'
        await page.wait_for_selector(f'{trail} tr[data-kind="tool_called"] >> nth=1')
        rows = await page.locator(f'{trail} tr[data-kind="tool_called"]').all_text_contents()
        assert "mesh_rooms" in rows[0] and "mesh_hello" in rows[1]  # newest first
        assert all("ok" in row and "args_digest=" in row for row in rows)
        assert await page.get_attribute(f"{trail} p[data-verified]", "data-verified") == "1"
        assert "private" not in (await page.text_content("#audit-trails") or "")
