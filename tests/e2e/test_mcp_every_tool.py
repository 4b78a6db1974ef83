"""Every tool of ``macula-mcp``, called over stdio on real subprocesses, with a good and a bad
argument; two agents ring and talk; idempotency replay and conflict survive a restart."""

from __future__ import annotations

import asyncio
import base64
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from macula.agent.audit_verify import verify_trail
from relay.station.station import Station, StationConfig
from support.mcpkit import Tools, server_env, server_params
from support.waiting import eventually

pytestmark = pytest.mark.anyio


class Agent(Tools):
    def __init__(self, client: Client, home: Path) -> None:
        super().__init__(client)
        self.home = home
        self.tools_called: set[str] = set()

    async def good(self, tool: str, **args: Any) -> dict[str, Any]:
        data = await super().good(tool, **args)
        self.tools_called.add(tool)
        return data


@asynccontextmanager
async def agent(home: Path, station: str, policy: str) -> AsyncIterator[Agent]:
    env = server_env(home, station, MACULA_MCP_CONTACT_POLICY=policy)
    async with Client(server_params(env)) as client:
        yield Agent(client, home)


async def test_every_tool_good_and_bad_over_stdio(tmp_path: Path) -> None:
    async with (
        Station(StationConfig(data_dir=tmp_path / "station", port=0)) as station,
        agent(tmp_path / "bob", station.endpoint, "open") as bob,
    ):
        bob_id = (await bob.good("mesh_hello", message="bob here"))["node_id"]
        async with agent(tmp_path / "ada", station.endpoint, "ask") as ada:
            await exercise(ada, bob, bob_id)
            everything = {t.name for t in (await ada.client.list_tools()).tools}
            called = ada.tools_called | bob.tools_called
            assert everything - called == set(), f"never called: {everything - called}"
    for home in (tmp_path / "bob", tmp_path / "ada"):  # every tool, good and bad: still intact
        (trail,) = (home / "audit").iterdir()
        report = verify_trail(trail)
        assert report.problem is None and report.entries > 20, (home, report)


async def exercise(ada: Agent, bob: Agent, bob_id: str) -> None:
    ada_id = (await ada.good("mesh_hello", operator_name="ada"))["node_id"]
    await ada.bad("mesh_hello", message="x" * 5000)
    await bob.good("mesh_hello", message="bob again")  # ada listens now

    async def ada_sees_bob() -> bool:
        return any(a["node_id"] == bob_id for a in (await ada.good("mesh_agents"))["agents"])

    await eventually(ada_sees_bob, 10, interval=0.05)
    await ada.bad("mesh_agents", limit=0)
    # pub/sub
    watch = asyncio.create_task(
        bob.good("mesh_watch", topic="e2e.news", duration_seconds=5, count=1)
    )
    while not watch.done():  # SUBSCRIBE has no ack: publish until the watch has one
        await ada.good("mesh_publish", topic="e2e.news", fact={"n": 1})
        await asyncio.wait({watch}, timeout=0.2)  # polling interval (watch ends in 5 s)
    assert (await watch)["events"][0]["payload"] == {"n": 1}
    await ada.bad("mesh_publish", topic="", fact=1)
    await ada.bad("mesh_watch", topic="t", duration_seconds=0)
    # serving and calling
    echo = f'{sys.executable} -c "import json,sys; print(json.dumps(json.load(sys.stdin)))"'
    await bob.good("mesh_serve", name="org.example.e2e.echo_v1", exec=echo)
    await bob.bad("mesh_serve", name="org.example.e2e.echo_v1", exec="")

    async def routed() -> bool:  # ADVERTISE has no ack: until the station routes the call
        result = await ada.client.call_tool(
            "mesh_call", {"procedure": "org.example.e2e.echo_v1", "args": {"a": 1}}
        )
        return (result.structured_content or {}).get("code") != "unknown_next_peer"

    await eventually(routed, 10, interval=0.05)
    assert (await ada.good("mesh_call", procedure="org.example.e2e.echo_v1", args={"a": 1}))[
        "result"
    ] == {"a": 1}
    await ada.bad("mesh_call", procedure="org.example.e2e.nobody_v1", args={})
    await bob.good("mesh_unserve", name="org.example.e2e.echo_v1")
    await bob.bad("mesh_unserve", name="org.example.e2e.never_served_v1")
    # idempotency: the same key replays, a different request under it is refused
    first = await ada.good("mesh_publish", topic="e2e.once", fact=1, idempotency_key="k-1")
    again = await ada.good("mesh_publish", topic="e2e.once", fact=1, idempotency_key="k-1")
    assert again["seq"] == first["seq"] and again["replayed"] == 1
    assert (await ada.bad("mesh_publish", topic="e2e.once", fact=2, idempotency_key="k-1"))[
        "code"
    ] == "idempotency_conflict"
    # content
    put = await ada.good(
        "mesh_put", content=base64.b64encode(b"shared bytes").decode(), name="n.txt"
    )
    assert (
        base64.b64decode((await bob.good("mesh_get", mcid_hex=put["mcid_hex"]))["content_base64"])
        == b"shared bytes"
    )
    await ada.bad("mesh_put", content="not base64!!")
    await bob.bad("mesh_get", mcid_hex="00")
    # DHT
    endpoints = await ada.good("mesh_find_records_by_type", record_type="station_endpoint")
    key = endpoints["records"][0]["key_hex"]
    assert (await ada.good("mesh_find_record", key_hex=key))["record"] is not None
    assert (await ada.good("mesh_find_records", key_hex=key))["count"] >= 1
    await ada.bad("mesh_find_record", key_hex="zz")
    await ada.bad("mesh_find_records", key_hex="00")
    await ada.bad("mesh_find_records_by_type", record_type="no_such_type")
    # shared memory and the station directory
    await ada.good(
        "mesh_remember", content="The station restarts cleanly on SIGTERM.", source_label="ops"
    )
    await ada.bad("mesh_remember", content="")
    assert (await bob.good("mesh_recall", query_text="restart SIGTERM"))["hits"]
    await bob.bad("mesh_recall", query_text="x", top_k=0)
    docs = ada_home_docs(ada)
    await ada.good("mesh_remember_directory", directory=str(docs))
    await ada.bad("mesh_remember_directory", directory=str(docs / "missing"))
    assert (await bob.good("mesh_list_stations"))["count"] == 1
    await bob.bad("mesh_list_stations", near={"lng": 3.0})
    # rings and rooms: bob's policy is open, ada's is ask
    rung = await ada.good("mesh_ring", to=bob_id, purpose="review")
    assert (rung["answer"], rung["joined"]) == (1, 1)
    await ada.bad("mesh_ring", to="nobody_we_know_1234", purpose="x")
    room = rung["room_topic"]
    asked = await ada.good("mesh_say", room_topic=room, kind="question_asked", text="ok?")
    heard: list[str] = []  # bob's unread, oldest first: the question, after ada's room_opened
    while "ok?" not in heard and len(heard) < 3:  # ("review": caught up when bob joined)
        waited = await bob.good("mesh_wait_room", room_topic=room, wait_seconds=10)
        heard.append(waited["message"]["text"])
    assert heard[-1] == "ok?" and set(heard) <= {"review", "ok?"}
    await bob.good(
        "mesh_say",
        room_topic=room,
        kind="answer_given",
        text="yes",
        in_reply_to=asked["message_id"],
    )
    await bob.bad("mesh_say", room_topic=room, kind="answer_given", text="no parent")
    await bob.bad("mesh_wait_room", room_topic="agents.room.nothex", wait_seconds=1)
    inbox = await ada.good("mesh_read_inbox")
    assert any(
        m["kind"] == "answer_given" and m["depth"] == 1
        for r in inbox["rooms"]
        for m in r["messages"]
    )
    opened = await ada.good("mesh_open_room", purpose="office hours", public=1)
    await ada.bad("mesh_open_room", public=7)
    await bob.good("mesh_join_room", room_topic=opened["room_topic"])
    await bob.bad("mesh_join_room", room_topic="agents.lobby.x")
    await bob.good("mesh_leave_room", room_topic=opened["room_topic"])
    await bob.bad("mesh_leave_room", room_topic=opened["room_topic"], close=1)
    assert (await ada.good("mesh_rooms"))["joined"]
    await bob.good("mesh_observe_lobby", max_rooms=5)
    await bob.bad("mesh_observe_lobby", max_rooms=0)
    await bob.good("mesh_lobby_transcript", limit=10)
    await bob.bad("mesh_lobby_transcript", limit=0)
    await bob.good("mesh_unobserve_lobby")
    # ask policy: bob rings ada, ada defers, then accepts
    # mesh_wait_ring reports progress once its wait counts rings: ring only then
    wait_began = asyncio.Event()

    async def progressed(progress: float, total: float | None, message: str | None) -> None:
        wait_began.set()

    waiting = asyncio.create_task(
        ada.client.call_tool("mesh_wait_ring", {"wait_seconds": 10}, progress_callback=progressed)
    )
    await asyncio.wait_for(wait_began.wait(), 10)
    deferred = await bob.good("mesh_ring", to=ada_id, purpose="pair?")
    assert deferred["answer"] == 3
    waited = await waiting
    assert not waited.is_error and waited.structured_content is not None
    assert waited.structured_content["ring"]["ring_id"] == deferred["ring_id"]
    ada.tools_called.add("mesh_wait_ring")
    await ada.bad("mesh_wait_ring", wait_seconds=-1)
    answered = await ada.good("mesh_answer_ring", ring_id=deferred["ring_id"], answer=1)
    assert answered["caller_notified"] == 1
    await ada.bad("mesh_answer_ring", ring_id=deferred["ring_id"], answer=5)
    await ada.good("mesh_trust_agent", node_id=bob_id)
    await ada.bad("mesh_trust_agent", node_id="not-a-node")
    await ada.good("mesh_untrust_agent", node_id=bob_id)
    await ada.bad("mesh_untrust_agent", node_id="")
    # realms: a whole join (serve, approve) is tests/e2e/test_realm_e2e.py; here, no join service
    assert (await ada.good("mesh_list_realms"))["realms"] == []
    assert (await ada.bad("mesh_join_realm", realm="org.example.nobody"))["retryable"] in (0, 1)
    await ada.bad("mesh_join_realm", realm="Not A Name")
    ada.tools_called.add("mesh_join_realm")
    await exercise_reservations(ada, bob, ada_id)
    await exercise_tasks(ada, bob, bob_id)
    await ada.good("mesh_goodbye")
    await bob.good("mesh_goodbye")
    assert (await bob.bad("mesh_goodbye", idempotency_key=""))["code"] == "invalid_argument"


async def exercise_reservations(ada: Agent, bob: Agent, ada_id: str) -> None:
    """Path reservations (the whole story: tests/integration/test_mcp_reservations.py and the
    guard's tests/e2e/test_commit_guard.py)."""
    project = "example.org/e2e/app"
    await ada.good("mesh_reserve_paths", paths=["src/**"], project=project, reason="e2e")
    clash = await bob.bad("mesh_reserve_paths", paths=["src/a.py"], project=project)
    assert clash["code"] == "reservation_conflict" and "e2e" in clash["detail"]
    await ada.bad("mesh_reserve_paths", paths=["../x"], project=project)
    listed = await bob.good("mesh_reservations", project=project)
    assert listed["reservations"][0]["holder"] == ada_id and listed["next_page"] is None
    await bob.bad("mesh_reservations", project=project, cursor="x")
    assert (await ada.good("mesh_release_paths", project=project))["released"] == 1
    await ada.bad("mesh_release_paths", paths=["/etc/passwd"], project=project)
    # the audit trail: bob's served procedure was called by ada (a digest, never the args)
    calls = await bob.good("mesh_audit", kind="call_received")
    assert calls["entries"][0]["facts"]["caller"] == ada_id, calls
    assert "content_digest" in calls["entries"][0]["facts"]
    await bob.bad("mesh_audit", cursor="../../etc/passwd")
    await bob.bad("mesh_audit", kind="tool_deleted")
    await bob.bad("mesh_audit", since_seq=5, until_seq=2)


async def exercise_tasks(ada: Agent, bob: Agent, bob_id: str) -> None:
    """The task tools: ada hands bob a task, bob asks, ada answers, bob completes once."""
    sent = await ada.good("mesh_task_send", to=bob_id, title="check", input="is 2+2 4?")
    await ada.bad("mesh_task_send", to=bob_id, title="", input="x")
    task_id = sent["task_id"]
    await bob.good("mesh_task_update", task_id=task_id, state="input_required", note="base?")
    await bob.bad("mesh_task_update", task_id=task_id, state="done")
    asked = await ada.good("mesh_task_wait", task_id=task_id, wait_seconds=10, after_state_seq=1)
    assert asked["task"]["state"] == "input_required"
    await ada.bad("mesh_task_wait", task_id=task_id, wait_seconds=0)
    await ada.good("mesh_task_send", task_id=task_id, input="base 10")
    assert (await bob.good("mesh_task_get", task_id=task_id))["state"] == "working"
    await bob.bad("mesh_task_get", task_id="no such id!")
    await bob.good("mesh_task_complete", task_id=task_id, result="yes")
    assert (await bob.bad("mesh_task_complete", task_id=task_id, result="no"))[
        "code"
    ] == "already_terminal"
    assert (await ada.good("mesh_task_list", role="requester"))["count"] >= 1
    await ada.bad("mesh_task_list", role="boss")
    found = await bob.good("mesh_search", query="check", source="tasks")
    assert [hit["task_id"] for hit in found["hits"]] == [task_id]
    assert (await bob.bad("mesh_search", query='"*'))["code"] == "no_words"
    other = await ada.good("mesh_task_send", to=bob_id, title="second", input="x")
    await ada.good("mesh_task_cancel", task_id=other["task_id"])
    await ada.bad("mesh_task_cancel", task_id=task_id)
    shown = await bob.good("mesh_approvals")  # the owner's queue: metadata only, read-only
    assert (shown["pending"], shown["total"]) == ([], 0)
    await bob.bad("mesh_approvals", limit=0)


def ada_home_docs(agent: Agent) -> Path:
    docs = agent.home / "docs"
    docs.mkdir(exist_ok=True)
    (docs / "notes.md").write_text("Deploy notes: the relay listens on UDP 4433 by default.\n")
    (docs / "blob.txt").write_bytes(b"\x00\x01binary")
    return docs
