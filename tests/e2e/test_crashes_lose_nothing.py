"""Nothing lost at the agent's edge, with crashes rather than polite stops (issue 37): a real
station process is SIGKILLed three times and started again on the same key, port and data dir
while alice talks (she goes on talking while it is dead); bob's ``macula-mcp`` is SIGKILLed and
started again on its home. Every message alice was told was said (``delivered`` 1, or 0 and
queued) is then read by bob through his MCP tools, each exactly once, in pages."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import anyio
import pytest

from support.mcpkit import StrictTools, kill, killable_server, server_env
from support.processkit import station_process

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(240)]
SAID_PER_PHASE = 6


async def _say(alice: StrictTools, room: str, text: str, told: dict[str, str]) -> None:
    said = await alice.good("mesh_say", room_topic=room, text=text)
    assert said["delivered"] in (0, 1), said  # ok: published now, or queued to go once back
    told[said["message_id"]] = text


async def _status(side: StrictTools) -> dict[str, Any]:
    found = await side.client.read_resource("mesh://status", cache_mode="bypass")
    return dict(json.loads(getattr(found.contents[0], "text", "{}")))


async def _reconnected(side: StrictTools, reconnects: int) -> int:
    """Wait until ``side`` is connected again after ``reconnects``; its reconnects now."""
    deadline = anyio.current_time() + 30
    while anyio.current_time() < deadline:
        status = await _status(side)
        if status.get("connected") == 1 and status["reconnects"] > reconnects:
            return int(status["reconnects"])
        await anyio.sleep(0.05)  # polling mesh://status: the condition is in the other process
    raise AssertionError(f"not reconnected within 30 s: {status}")


async def _read_everything(
    bob: StrictTools, room: str, told: dict[str, str], read: list[str]
) -> list[str]:
    """Bob's inbox, page after page, until every told message came (waiting in the room for
    what catch-up or an outbox has not brought yet); ``read`` and what the pages held."""
    read = list(read)
    deadline = anyio.current_time() + 60
    while not set(told) <= set(read) and anyio.current_time() < deadline:
        page = await bob.good("mesh_read_inbox")
        read += [m["message_id"] for r in page["rooms"] for m in r["messages"]]
        if page["remaining"] == 0 and not set(told) <= set(read):
            waited = await bob.good("mesh_wait_room", room_topic=room, wait_seconds=2)
            read += [m["message_id"] for m in waited["messages"]]
    return read  # the caller names what is missing


async def test_every_message_said_through_crashes_is_read_exactly_once(tmp_path: Path) -> None:
    told: dict[str, str] = {}
    async with station_process(tmp_path / "station") as station:
        alice_home, bob_home = tmp_path / "alice", tmp_path / "bob"
        alice_env = server_env(alice_home, station.endpoint, MACULA_MCP_CONTACT_POLICY="open")
        bob_env = server_env(bob_home, station.endpoint, MACULA_MCP_CONTACT_POLICY="open")
        async with killable_server(alice_home, alice_env) as alice:
            await alice.good("mesh_hello", operator_name="alice")
            room = (await alice.good("mesh_open_room", purpose="crash test"))["room_topic"]
            first_bob = killable_server(bob_home, bob_env)
            bob = await first_bob.__aenter__()
            await bob.good("mesh_join_room", room_topic=room)
            for n in range(SAID_PER_PHASE):
                await _say(alice, room, f"before any crash {n}", told)
            first = await bob.good("mesh_read_inbox")  # bob reads a first page live
            read = [m["message_id"] for r in first["rooms"] for m in r["messages"]]
            kill(bob_home)  # bob's macula-mcp: SIGKILL, mid-conversation
            with contextlib.suppress(Exception):  # its client only finds it gone
                await first_bob.__aexit__(None, None, None)
            reconnects = (await _status(alice))["reconnects"]
            for crash in range(3):  # the station: SIGKILL, alice talks on, then it is back
                await station.kill()
                for n in range(SAID_PER_PHASE // 2):
                    await _say(alice, room, f"station {crash} down {n}", told)
                await station.start()
                reconnects = await _reconnected(alice, reconnects)
                for n in range(SAID_PER_PHASE):
                    await _say(alice, room, f"station {crash} back {n}", told)
            async with killable_server(bob_home, bob_env) as bob:  # bob again, same home
                read = await _read_everything(bob, room, told, read)
                missing = sorted(told[m] for m in set(told) - set(read))
                if missing:  # what each side knows, for the failure below
                    outbox = (await alice.good("mesh_rooms"))["outbox"]
                    kept = await bob.good("mesh_lobby_transcript", topic=room, limit=500)
                    held = {m["text"] for m in kept["messages"]}
                    missing += [f"alice's outbox {outbox}", f"bob holds {set(missing) & held}"]
                    missing += [f"bob {await _status(bob)}", f"alice {await _status(alice)}"]
    assert len(read) == len(set(read)), "a message was read twice"
    assert set(told) <= set(read), missing
    assert len(told) == SAID_PER_PHASE * 4 + 3 * (SAID_PER_PHASE // 2)
