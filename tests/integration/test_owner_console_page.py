"""The console's Owner tab in a real headless Chromium: one click turns a tool off for the
home, the file says so and the hosted agent's ``tools/list`` no longer has it; a preset is one
click too; a malformed file is shown with its line and key. Skipped, saying why, when
/usr/bin/chromium is absent (``.ci/run`` installs it with apt-get)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from relay.station.station import Station
from support.consolekit import CHROMIUM, Home, agent, chromium, console
from support.waiting import eventually

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} absent (apt chromium)"),
]


async def test_one_click_turns_a_tool_off_and_the_agent_loses_it(
    station: Station, tmp_path: Path
) -> None:
    home = Home(tmp_path / "home")
    async with (
        chromium() as browser,
        agent(home, station, "ada", named=1) as ada,
        console(home) as served,
    ):

        async def listed() -> set[str]:
            return {t.name for t in (await ada.client.list_tools()).tools}

        assert "mesh_serve" in await listed()
        page = await browser.new_page()
        await page.goto(served.url)
        await page.click('#tabs button[data-tab="owner"]')
        button = page.locator('button[data-switch="mesh_serve"]')
        await button.wait_for()
        assert await button.text_content() == "on"
        await button.click()
        await eventually(lambda: (home.home / "owner.toml").exists())
        assert "mesh_serve = 0" in (home.home / "owner.toml").read_text()
        await page.wait_for_selector('button[data-switch="mesh_serve"]:text("off")')
        assert "mesh_serve" not in await listed()

        await page.click('button[data-preset="read-only"]')
        await eventually(lambda: "read-only" in (home.home / "owner.toml").read_text())
        assert "mesh_say" not in await listed() and "mesh_read_inbox" in await listed()

        (home.home / "owner.toml").write_text("[tools]\nmesh_say = 9\n")
        await page.click('#tabs button[data-tab="owner"]')  # reloads the tab
        problem = page.locator("#owner-problem")
        await eventually(lambda: _says(problem, "line 2, key tools.mesh_say"))
        assert await listed() == set()


async def _says(locator: Any, text: str) -> bool:
    return text in (await locator.text_content() or "")
