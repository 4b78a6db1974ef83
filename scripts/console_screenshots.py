"""Screenshots of the console's main views and the station's status page, for the README
(``docs/console/*.png``).

    uv run python scripts/console_screenshots.py [--out docs/console]

Everything is real and on loopback: a station in this process (its status page on a monitor
port), three agents of one home named as ``register --attach`` names them (``MACULA_MCP_AGENT``
and an operator name: alice and bob talk in one room, bob rings carol, who answers under
``ask``, carol hands alice a task), a realm of this home with a join request waiting, the
console served as the daemon serves it, and Debian's headless Chromium (``/usr/bin/chromium``)
driven by playwright. Nothing leaves the machine; the temporary home is removed at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from macula.clock import now_ms
from macula.realm.authority import Realm
from relay.monitor.figures import Lifecycle
from relay.monitor.port import Monitor
from relay.station.station import Station, StationConfig
from tools.daemon.console import actions
from tools.daemon.console.person_key import person_identity
from tools.daemon.http.home_token import home_token
from tools.daemon.http.listener import bind, build_app, serve
from tools.server.runtime import Runtime, open_runtime

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-sync"]
VIEWS = ("rooms", "rings", "tasks", "present", "realms", "identities")


class Home:
    def __init__(self, home: Path) -> None:
        self.home = home
        self.hosted: list[Runtime] = []

    def runtimes(self) -> list[Runtime]:
        return list(self.hosted)


@contextlib.asynccontextmanager
async def agent(
    home: Home, station: Station, name: str, operator: str, policy: str
) -> AsyncIterator[Runtime]:
    env = {
        "MACULA_HOME": str(home.home),
        "MACULA_MESH_STATIONS": station.endpoint,
        "MACULA_MCP_AGENT": name,
        "MACULA_MCP_CONTACT_POLICY": policy,
        "MACULA_MCP_OPERATOR_NAME": operator,
        "MACULA_MCP_MODEL": "claude",
    }
    async with open_runtime(env) as runtime:
        await runtime.agent.hello()
        home.hosted.append(runtime)
        yield runtime


async def until(check: Any, timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await check():
        if loop.time() > deadline:
            raise SystemExit("the mesh did not settle in time")
        await asyncio.sleep(0.05)  # polling a condition, with a deadline


async def stage(alice: Runtime, bob: Runtime, carol: Runtime, home: Path) -> None:
    """A conversation, a ring waiting under ask, a task, a realm join request."""
    for runtime in (alice, bob, carol):
        await runtime.agent.hello()
    bob_id, alice_id = bob.node.identity.node_id, alice.node.identity.node_id

    async def heard() -> bool:
        rows = await alice.agent.presence.agents(50, 0)
        return {r.node_id for r in rows} >= {bob_id, carol.node.identity.node_id}

    await until(heard)
    placed = await alice.agent.rings.ring(bob_id, "review the release notes", wait_join_seconds=5)
    room = placed.room_topic
    rooms = alice.agent.rooms
    asked = await rooms.say(room, "question_asked", "Is the changelog for 0.4 complete?")
    await bob.agent.rooms.say(
        room, "answer_given", "Two entries missing: the console and MCP over HTTP.",
        in_reply_to=asked.message_id,
    )  # fmt: skip
    await rooms.say(room, "remark_made", "Adding them now; I will report back here.")
    person = {"room_topic": room, "kind": "remark_made", "text": "Mention the person mark too."}
    await actions.say(alice, person_identity(home), person)
    await bob.agent.rings.ring(carol.node.identity.node_id, "pair on the flaky federation test")
    await carol.agent.tasks.send(alice_id, "summarise open issues", "the ones labelled console")
    realm = Realm(home, "crew")
    realm.create(difficulty=0)
    realm.start_session(carol.node.identity.node_id, now_ms())


async def shoot(url: str, status_url: str, out: Path) -> list[Path]:
    from playwright.async_api import async_playwright

    saved = []
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = await browser.new_page(viewport={"width": 1200, "height": 720})
            await page.goto(url)
            await page.wait_for_selector('#feed[data-state="live"]')
            await page.wait_for_selector("#transcript li.msg")
            for view in VIEWS:
                await page.click(f'#tabs button[data-tab="{view}"]')
                path = out / f"{view}.png"
                await page.screenshot(path=str(path))
                saved.append(path)
            await page.goto(status_url)
            await page.wait_for_selector("#clients")
            path = out / "status.png"
            await page.screenshot(path=str(path), full_page=True)
            saved.append(path)
        finally:
            await browser.close()
    return saved


async def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="console-shots-") as folder:
        home = Home(Path(folder) / "home")
        config = StationConfig(data_dir=Path(folder) / "station", port=0)
        async with (
            Station(config) as station,
            agent(home, station, "alice", "Ann", "open") as alice,
            agent(home, station, "bob", "Ben", "open") as bob,
            agent(home, station, "carol", "Cleo", "ask") as carol,
        ):
            await stage(alice, bob, carol, home.home)
            lifecycle = Lifecycle()
            lifecycle.ready = 1
            monitor = Monitor(station, lifecycle)
            host, monitor_port = await monitor.start("127.0.0.1", 0)
            app = build_app(home)
            stopping = asyncio.Event()
            sock = bind(0)
            port = sock.getsockname()[1]
            served = asyncio.create_task(serve(app, sock, home.home, stopping))
            try:
                url = f"http://127.0.0.1:{port}/?token={home_token(home.home)}"
                for path in await shoot(url, f"http://{host}:{monitor_port}/", out):
                    print(path)
            finally:
                stopping.set()
                await served
                await monitor.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("docs/console"))
    if not Path(CHROMIUM).exists():
        sys.exit(f"{CHROMIUM} is missing (apt-get install chromium)")
    asyncio.run(main(parser.parse_args().out))
