"""The console in a real headless Chromium (Debian's ``chromium`` driven by playwright) over a
real station: the page shows what agents say in a room as it happens; what a person types there
reaches the other agent's ``mesh_wait_room`` marked ``from_person`` 1; a ring waiting under
``ask`` is accepted from the page and the caller's ``mesh_ring`` (waiting with
``wait_answer_seconds``) returns accepted; a realm join is approved from the page. Agents are real
runtimes in this process, each used through its MCP tools (the SDK's in-process client), hosted
by the console as the daemon hosts them (the daemon's own listener: tests/e2e/test_console_cli.py).
Skipped, saying why, when /usr/bin/chromium is absent (``.ci/run`` installs it with apt-get)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from macula.clock import now_ms
from relay.station.station import Station
from support.consolekit import CHROMIUM, Agent, Home, agent, console
from support.joinkit import join_service
from support.waiting import eventually

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} absent (apt chromium)"),
]

SHOWN_WITHIN_MS = 1000  # the "within a second of mesh_say"
REALM = "org.example.crew"


async def meet(alice: Agent, bob: Agent) -> None:
    await alice.call("mesh_hello")
    await bob.call("mesh_hello")
    await alice.call("mesh_hello")

    async def sees(who: Agent, other: Agent) -> bool:
        rows = (await who.call("mesh_agents"))["agents"]
        return any(r["node_id"] == other.node_id and r["source"] != "directory" for r in rows)

    await eventually(lambda: sees(alice, bob))
    await eventually(lambda: sees(bob, alice))


async def waited_for(who: Agent, room: str, text: str) -> list[dict[str, Any]]:
    """Every message ``who``'s ``mesh_wait_room`` returns until one says ``text``."""
    heard: list[dict[str, Any]] = []
    while not any(m["text"] == text for m in heard):
        got = await who.call("mesh_wait_room", room_topic=room, wait_seconds=10)
        assert got["timed_out"] == 0, heard
        heard.extend(got["messages"])
    return heard


async def opened(browser: Any, url: str) -> Any:
    page = await browser.new_page()
    await page.goto(url)
    assert "token=" not in page.url  # the token left the address bar at once
    await page.wait_for_selector('#feed[data-state="live"]')
    return page


async def test_the_page_shows_a_room_live_and_a_persons_reply_reaches_the_other_agent(
    station: Station, tmp_path: Path, browser: Any
) -> None:
    home = Home(tmp_path / "home")
    async with (
        agent(home, station, "alice") as alice,
        agent(home, station, "bob") as bob,
        console(home) as served,
    ):
        await meet(alice, bob)
        rung = await alice.call("mesh_ring", to=bob.node_id, purpose="the deploy")
        assert rung["answer"] == 1 and rung["joined"] == 1, rung
        room = rung["room_topic"]
        page = await opened(browser, served.url)
        await page.click(f'#room-list li[data-room="{room}"]')
        await page.select_option("#say-as", alice.node_id)  # both are in it: alice publishes

        said = await alice.call("mesh_say", room_topic=room, kind="remark_made", text="deploying")
        shown = f'#transcript li[data-message="{said["message_id"]}"]'
        await page.wait_for_selector(shown, timeout=SHOWN_WITHIN_MS)

        await page.fill("#say-text", "stop: wait for the review")
        await page.click("#say-send")
        heard = await waited_for(bob, room, "stop: wait for the review")
        person = [m for m in heard if m["text"] == "stop: wait for the review"]
        assert len(person) == 1, heard
        assert person[0]["from_person"] == 1 and person[0]["from"] == alice.node_id
        assert person[0]["attested"] == 1
        assert [m["from_person"] for m in heard if m is not person[0]] == [0] * (len(heard) - 1)
        shown = f'#transcript li[data-message="{person[0]["message_id"]}"]'
        await page.wait_for_selector(shown)
        assert await page.get_attribute(shown, "data-from-person") == "1"


async def test_a_ring_under_ask_is_accepted_from_the_page(
    station: Station, tmp_path: Path, browser: Any
) -> None:
    home = Home(tmp_path / "home")
    async with (
        agent(home, station, "alice") as alice,
        agent(home, station, "bob", policy="ask") as bob,
        console(home) as served,
    ):
        await meet(alice, bob)
        page = await opened(browser, served.url)
        ringing = asyncio.create_task(
            alice.call(
                "mesh_ring", to=bob.node_id, purpose="pair on the bug", wait_answer_seconds=30
            )
        )  # deferred under ask: alice's mesh_ring waits for the person's answer
        await page.click('#tabs button[data-tab="rings"]')
        accept = "li[data-ring] button.accept"
        await page.wait_for_selector(accept, timeout=15_000)
        ring_id = await page.get_attribute("li[data-ring]", "data-ring")
        await page.click(accept)

        rung = await asyncio.wait_for(ringing, 30)
        assert (rung["ring_id"], rung["answer"], rung["late_answer"]) == (ring_id, 1, 1), rung
        rooms = await bob.call("mesh_rooms")
        assert rung["room_topic"] in {r["room_topic"] for r in rooms["joined"]}
        await page.wait_for_selector(f'li[data-ring="{rung["ring_id"]}"]', state="detached")


async def test_a_realm_join_is_approved_from_the_page(
    station: Station, tmp_path: Path, browser: Any
) -> None:
    home = Home(tmp_path / "home")  # the console's home holds the realm's authority key
    elsewhere = Home(tmp_path / "elsewhere")  # the joiner's, not hosted by this console
    async with (
        join_service(station, home.home, REALM) as service,
        agent(elsewhere, station, "dana") as dana,
        console(home) as served,
    ):
        asked = await dana.call("mesh_join_realm", realm=REALM)
        assert asked["status"] == "pending", asked
        page = await opened(browser, served.url)
        await page.click('#tabs button[data-tab="realms"]')
        await page.click(f'#join-list li[data-join="{asked["code"]}"] button.approve')

        joined = await dana.call("mesh_join_realm", realm=REALM, wait_seconds=20)
        assert joined["status"] == "approved", joined
        status, member = service.realm.status_of(bytes.fromhex(dana.node_id), now_ms())
        assert status == "approved" and member is not None
        await page.wait_for_selector("#join-list li[data-join]", state="detached")


def petname_of(who: Agent) -> str:
    return str(who.runtime.agent.identity_view()["petname"])


async def test_two_hosted_agents_share_one_room_entry_with_their_given_names(
    station: Station, tmp_path: Path, browser: Any
) -> None:
    home = Home(tmp_path / "home")
    async with (
        agent(home, station, "reviewer", named=1, operator="Ann") as alice,
        agent(home, station, "builder", named=1, operator="Bo") as bob,
        console(home) as served,
    ):
        await meet(alice, bob)
        rung = await alice.call("mesh_ring", to=bob.node_id, purpose="ship the console")
        assert rung["answer"] == 1 and rung["joined"] == 1, rung
        room = rung["room_topic"]
        page = await opened(browser, served.url)
        entry = f'#room-list li[data-room="{room}"]'
        await page.wait_for_selector(f"{entry} .tag.host >> nth=1")
        assert await page.locator("#room-list li").count() == 1  # one entry, two hosts in it
        hosts = await page.locator(f"{entry} .tag.host").all_text_contents()
        assert sorted(hosts) == sorted(
            [f"{petname_of(alice)} (reviewer · Ann)", f"{petname_of(bob)} (builder · Bo)"]
        )
        assert await page.get_attribute(entry, "title") == room  # the topic, as a tooltip
        await page.click(entry)
        assert await page.text_content("#room-title") == "ship the console"
        people = await page.text_content("#room-people") or ""
        assert f"{petname_of(alice)} (reviewer · Ann)" in people
        assert f"{petname_of(bob)} (builder · Bo)" in people
        assert room in (await page.text_content("#room-meta") or "")
        assert "register --attach" in (await page.text_content("#not-hosted") or "")

        await page.select_option("#say-as", bob.node_id)
        await page.fill("#say-text", "the console builds")
        await page.click("#say-send")
        heard = await waited_for(alice, room, "the console builds")
        [said] = [m for m in heard if m["text"] == "the console builds"]
        assert said["from"] == bob.node_id and said["from_person"] == 1
        shown = f'#transcript li[data-message="{said["message_id"]}"]'
        await page.wait_for_selector(shown)
        assert f"{petname_of(bob)} (builder · Bo) (person)" in (
            await page.text_content(shown) or ""
        )
        assert await page.locator(f"{shown} >> nth=1").count() == 0  # each message once
        await page.wait_for_selector('#say-status[data-ok="1"]', state="attached")
        assert await page.text_content("#say-status") == ""  # no stray "done" under the input
        await page.click('#tabs button[data-tab="identities"]')
        listed = await page.locator("#identity-list li").all_text_contents()
        assert any("agent name: reviewer · operator: Ann" in text for text in listed), listed
        body = await page.text_content("body") or ""
        assert "done" not in body.split(), body


async def test_a_failed_say_is_explained_then_cleared_by_the_next_success(
    station: Station, tmp_path: Path, browser: Any
) -> None:
    home = Home(tmp_path / "home")
    async with (
        agent(home, station, "alice") as alice,
        agent(home, station, "bob") as bob,
        console(home) as served,
    ):
        await meet(alice, bob)
        rung = await alice.call("mesh_ring", to=bob.node_id, purpose="the flaky test")
        page = await opened(browser, served.url)
        await page.click(f'#room-list li[data-room="{rung["room_topic"]}"]')
        await page.fill("#say-text", "x" * 17_000)  # over the console's 16 KiB
        await page.click("#say-send")
        await page.wait_for_selector('#say-status[data-ok="0"]')
        assert "invalid_argument" in (await page.text_content("#say-status") or "")
        await page.fill("#say-text", "short now")
        await page.click("#say-send")
        await page.wait_for_selector('#say-status[data-ok="1"]', state="attached")
        assert await page.text_content("#say-status") == ""
