"""``mesh_search`` (issue 40) through the whole server and the official MCP client, two agents of
two ``MACULA_HOME``s through a real station subprocess on loopback: a message of either room
(one of them end-to-end encrypted) found by word, by sender and by time, with its snippet; tasks
found by title and by result, on both sides; pages followed to the end; hostile queries refused
or answered, never with SQLite's words."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from support.agentkit import Agent, agent, no_booleans
from support.processkit import StationProcess, station_process
from support.waiting import eventually

pytestmark = pytest.mark.anyio
MODE = "legacy"


@pytest.fixture
async def station(tmp_path: Path) -> AsyncIterator[StationProcess]:
    async with station_process(tmp_path / "station") as running:
        yield running


async def search(who: Agent, **args: Any) -> dict[str, Any]:
    found = await who.ok("mesh_search", **args)
    no_booleans(found)
    return found


async def found_in(who: Agent, query: str, **args: Any) -> list[dict[str, Any]] | None:
    hits: list[dict[str, Any]] = (await search(who, query=query, **args))["hits"]
    return hits or None


async def test_two_agents_find_what_was_said_and_handed(
    station: StationProcess, tmp_path: Path
) -> None:
    async with (
        agent(station, tmp_path / "alice", MODE) as alice,
        agent(station, tmp_path / "bob", MODE) as bob,
    ):
        me = await alice.ok("mesh_hello", operator_name="alice")
        them = await bob.ok("mesh_hello", operator_name="bob")
        plain = await alice.ok("mesh_ring", to=them["node_id"], purpose="review")
        # the other way round: one ring per callee every 2 s
        sealed = await bob.ok("mesh_ring", to=me["node_id"], purpose="planning", private=1)
        assert plain["joined"] == 1 and sealed["joined"] == 1
        said = await alice.ok(
            "mesh_say", room_topic=plain["room_topic"], text="Alice owns the auth module now"
        )
        await bob.ok(
            "mesh_say", room_topic=sealed["room_topic"], text="use the branch zephyr-release"
        )

        # bob finds alice's word in the plain room, with its snippet and the ids to act on
        hits = await eventually(lambda: found_in(bob, "auth module"))
        [hit] = hits
        assert (hit["room_topic"], hit["message_id"]) == (plain["room_topic"], said["message_id"])
        assert hit["from"] == me["node_id"] and hit["from_petname"] == me["petname"]
        assert "[auth]" in hit["snippet"] and "[module]" in hit["snippet"]
        assert hit["source"] == "rooms" and hit["unread"] == 1
        # the inbox: what others said and is unread (alice's own words are never in hers)
        assert await found_in(bob, "auth", source="inbox")
        assert await found_in(alice, "auth", source="inbox") is None
        assert await found_in(alice, "auth", source="rooms")
        # alice finds bob's word in the end-to-end encrypted room (decrypted, indexed locally)
        [sealed_hit] = await eventually(lambda: found_in(alice, "zephyr"))
        assert (
            sealed_hit["room_topic"] == sealed["room_topic"] and "[zephyr]" in sealed_hit["snippet"]
        )

        # by sender (node id, petname) and by room
        assert await found_in(bob, "auth", sender=me["node_id"])
        assert await found_in(bob, "auth", sender=them["node_id"]) is None
        assert await found_in(alice, "zephyr", sender=them["petname"])
        assert await found_in(alice, "zephyr", room_topic=plain["room_topic"]) is None
        # by time: the window holding the message, and one after it
        at = hit["received_ms"]
        assert await found_in(bob, "auth", since_ms=at, until_ms=at)
        assert await found_in(bob, "auth", since_ms=at + 1) is None
        assert await found_in(bob, "auth", until_ms=at - 1) is None

        # tasks, by title on the requester's side and by result on the assignee's
        sent = await alice.ok(
            "mesh_task_send", to=them["node_id"], title="rotate staging keys", input="all of them"
        )
        waited = await bob.ok("mesh_task_wait", wait_seconds=10)
        assert waited["task"]["task_id"] == sent["task_id"]
        await bob.ok("mesh_task_complete", task_id=sent["task_id"], result="rotated 12 keyfiles")
        [task_hit] = (await search(alice, query="staging", source="tasks"))["hits"]
        assert task_hit["task_id"] == sent["task_id"] and "[staging]" in task_hit["snippet"]
        [done] = (await search(bob, query="keyfiles"))["hits"]
        assert (done["source"], done["task_id"], done["state"]) == (
            "tasks",
            sent["task_id"],
            "completed",
        )


async def test_pages_reach_every_hit_once_and_hostile_queries_are_refused_or_answered(
    station: StationProcess, tmp_path: Path
) -> None:
    async with agent(station, tmp_path / "alice", MODE) as alice:
        room = await alice.ok("mesh_open_room", purpose="notes", wait_join_seconds=0.1)
        ids = set()
        for i in range(12):
            said = await alice.ok(
                "mesh_say", room_topic=room["room_topic"], text=f"ledger entry {i}"
            )
            ids.add(said["message_id"])
        seen: list[str] = []
        page = await search(alice, query="ledger", limit=5)
        assert page["matched"] == 12
        while True:
            seen += [hit["message_id"] for hit in page["hits"]]
            if page["next_page"] is None:
                assert page["remaining"] == 0
                break
            assert page["remaining"] == 12 - len(seen)
            assert page["next_page"]["tool"] == "mesh_search"
            page = await search(alice, **page["next_page"]["arguments"])
        assert sorted(seen) == sorted(ids)

        for query in ('"', "*", "---", "", "   ", "😀"):
            error = await alice.refused("mesh_search", query=query)
            assert error["code"] in ("no_words", "invalid_argument"), (query, error)
            assert "sqlite" not in error["detail"].lower() and "fts" not in error["detail"].lower()
        for query in (
            'ledger" OR *',
            "text:ledger",
            "NEAR(ledger entry)",
            "-ledger ^entry",
            "ÉNTRY",
        ):
            answered = await search(alice, query=query)
            assert answered["terms"], query
        assert (await search(alice, query="ledger NEAR"))["hits"] == []  # NEAR is a word here
        assert (await alice.refused("mesh_search", query="x", source="mail"))["code"] == (
            "invalid_argument"
        )
        bad = await alice.refused("mesh_search", query="ledger", cursor="s12")
        assert bad["code"] == "invalid_argument"
        bad = await alice.refused(
            "mesh_search", query="x", source="tasks", room_topic=room["room_topic"]
        )
        assert bad["code"] == "invalid_argument"
