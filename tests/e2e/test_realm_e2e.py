"""A realm end to end: the ``macula-realm`` CLI and real ``macula-mcp`` as subprocesses.

create -> serve -> mesh_join_realm (code, link, QR text, PNG block) -> approve (a wrong code
first, exit 1) -> mesh_join_realm wait -> approved -> mesh_list_realms / mesh://identity ->
members -> revoke; and a realm name works as the realm argument of mesh_publish.

``test_a_realm_only_room_end_to_end``: every part a real process: a ``macula-relay``
protecting the realm (``--realm NAME=AUTHORITY_KEY``, a short ``--realm-sweep-ms``), the
owner's ``macula-realm`` (create, serve, approve, revoke), three ``macula-mcp``. ada and bob
join (code and QR returned), the owner approves both, both list the realm; ada rings bob into
a fresh room in the realm, they talk there. eve, who holds no membership, cannot join the room
(``realm_refused``), hears nothing of it on the wire while bob does, and what she publishes on
the room's topic reaches nobody. The owner revokes bob: within the sweep the station refuses
him, and he hears nothing more. No fixed sleeps: every wait is a poll with a deadline, or a
tool's own bounded wait.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest
from mcp import Client, StdioServerParameters
from mcp_types import ImageContent

from macula.wire.identity import realm_tag
from relay.station.station import Station, StationConfig
from support.processkit import free_udp_port
from support.waiting import eventually
from tools.launch import server_command

pytestmark = pytest.mark.anyio
NAME = "org.example.e2e"
REALM_CLI = [sys.executable, "-m", "macula.realm.cli"]
SWEEP_MS = 300
OPEN_POLICY = {"MACULA_MCP_CONTACT_POLICY": "open"}
T = TypeVar("T")


def realm_cli(home: Path, *args: str) -> tuple[int, dict[str, Any]]:
    done = subprocess.run(
        [*REALM_CLI, "--json", "--home", str(home), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stdout.strip(), done.stderr
    return done.returncode, json.loads(done.stdout)


@asynccontextmanager
async def serve(home: Path, station: str) -> AsyncIterator[subprocess.Popen[str]]:
    process = subprocess.Popen(
        [
            *REALM_CLI,
            "--json",
            "--home",
            str(home),
            "serve",
            "--station",
            station,
            "--publish-every-s",
            "0.2",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = await asyncio.to_thread(process.stdout.readline)
        assert json.loads(line)["serving"] == 1, line
        yield process
    finally:
        process.terminate()
        process.wait(timeout=20)


@asynccontextmanager
async def mcp(home: Path, station: str, **settings: str) -> AsyncIterator[Client]:
    env = dict(
        os.environ,
        MACULA_HOME=str(home),
        MACULA_MESH_STATIONS=station,
        MACULA_MCP_IDENTITY=str(home / "id.key"),
        **settings,
    )
    command = server_command()
    async with Client(StdioServerParameters(command=command[0], args=command[1:], env=env)) as c:
        yield c


@contextmanager
def relay(data_dir: Path, *flags: str) -> Iterator[str]:
    """``macula-relay`` in its own process; its endpoint (the line it prints when ready)."""
    command = [sys.executable, "-m", "relay.ops.cli", "--port", str(free_udp_port())]
    command += ["--data-dir", str(data_dir), "--log-level", "warning", *flags]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        endpoint = process.stdout.readline().strip()
        assert "@" in endpoint, f"the station did not start: {endpoint!r}"
        yield endpoint
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


# slow: test_a_realm_only_room_end_to_end covers create, join, approve, list and revoke too
@pytest.mark.slow
async def test_create_serve_join_approve_list_revoke(tmp_path: Path) -> None:
    owner = tmp_path / "owner"
    async with Station(StationConfig(data_dir=tmp_path / "station", port=0)) as station:
        code, created = realm_cli(owner, "create", NAME)
        assert code == 0 and len(created["authority"]) == 64
        assert (owner / "realms" / NAME / "authority.key").stat().st_mode & 0o777 == 0o600
        code, again = realm_cli(owner, "create", NAME)
        assert code == 1 and again["code"] == "exists"

        async with serve(owner, station.endpoint), mcp(tmp_path / "agent", station.endpoint) as c:
            bad = await c.call_tool("mesh_join_realm", {"realm": "Not A Name"})
            assert bad.is_error and bad.structured_content["code"] == "invalid_argument"

            joined = await c.call_tool("mesh_join_realm", {"realm": NAME})
            assert not joined.is_error, joined.structured_content
            ticket = joined.structured_content
            assert ticket["status"] == "pending" and len(ticket["code"]) == 9
            assert ticket["link"].startswith("macula-realm://approve?") and ticket["qr_text"]
            assert ticket["authority"] == created["authority"]
            [png] = [b for b in joined.content if isinstance(b, ImageContent)]
            assert png.mime_type == "image/png"
            assert base64.b64decode(png.data).startswith(b"\x89PNG")

            identity = await c.read_resource("mesh://identity")
            text = identity.contents[0].text  # type: ignore[union-attr]
            assert ticket["code"] not in text and json.loads(text)["realms"] == []

            code, pending = realm_cli(owner, "pending")
            assert code == 0 and [p["code"] for p in pending["pending"]] == [ticket["code"]]
            wrong = "2222-2222" if ticket["code"] != "2222-2222" else "3333-3333"
            code, refused = realm_cli(owner, "approve", wrong)
            assert code == 1 and refused["code"] == "unknown_code"
            code, approved = realm_cli(owner, "approve", ticket["link"])
            assert code == 0 and approved["status"] == "approved"

            waited = await c.call_tool("mesh_join_realm", {"realm": NAME, "wait_seconds": 20})
            outcome = waited.structured_content
            assert outcome["status"] == "approved", outcome
            assert "code" not in outcome and "link" not in outcome

            listed = (await c.call_tool("mesh_list_realms", {})).structured_content
            [membership] = listed["realms"]
            assert membership["name"] == NAME and membership["role"] == "member"
            assert membership["authority"] == created["authority"]
            assert set(membership) == {
                "name",
                "realm",
                "authority",
                "role",
                "joined_at",
                "valid_until",
            }
            identity = await c.read_resource("mesh://identity")
            view = json.loads(identity.contents[0].text)  # type: ignore[union-attr]
            assert [r["name"] for r in view["realms"]] == [NAME]

            published = await c.call_tool(
                "mesh_publish", {"topic": "e2e.crew", "fact": 1, "realm": NAME}
            )
            assert published.structured_content["realm"] == membership["realm"]

            code, members = realm_cli(owner, "members")
            node_id = members["members"][0]["node"]
            assert code == 0 and members["members"][0]["revoked"] == 0
            code, revoked = realm_cli(owner, "revoke", node_id)
            assert code == 0 and revoked["status"] == "revoked"
            code, members = realm_cli(owner, "members")
            assert members["members"][0]["revoked"] == 1
            code, twice = realm_cli(owner, "revoke", node_id)
            assert code == 1 and twice["code"] == "revoked"


def test_cli_bad_usage_and_rate_limit(tmp_path: Path) -> None:
    home = tmp_path / "owner"
    code, answer = realm_cli(home, "pending")
    assert code == 2 and answer["code"] == "which_realm"
    code, answer = realm_cli(home, "create", "Bad Name")
    assert code == 2 and answer["code"] == "bad_name"
    assert realm_cli(home, "create", NAME)[0] == 0
    code, answer = realm_cli(home, "revoke", "zz")
    assert code == 2 and answer["code"] == "bad_node_id"
    code, answer = realm_cli(home, "approve", "not-a-code")
    assert code == 1 and answer["code"] == "bad_code"
    for _ in range(2):
        assert realm_cli(home, "--max-wrong-codes", "2", "deny", "2222-2222")[0] == 1
    code, answer = realm_cli(home, "--max-wrong-codes", "2", "deny", "2222-2222")
    assert code == 3 and answer["code"] == "rate_limited"


async def call(client: Client, tool: str, args: dict[str, Any] | None = None) -> dict[str, Any]:
    result = await client.call_tool(tool, args or {})
    assert not result.is_error, (tool, result.structured_content)
    data = result.structured_content
    assert isinstance(data, dict)
    return data


async def refused(client: Client, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    result = await client.call_tool(tool, args)
    assert result.is_error, (tool, result.structured_content)
    error = result.structured_content
    assert isinstance(error, dict) and {"code", "detail", "next_action"} <= error.keys()
    return error


async def join(client: Client, owner: Path) -> dict[str, Any]:
    """mesh_join_realm (code, QR text and PNG), the owner approves, the approval is picked up."""
    started = await client.call_tool("mesh_join_realm", {"realm": NAME})
    ticket = started.structured_content
    assert not started.is_error and ticket is not None, ticket
    assert ticket["status"] == "pending" and len(ticket["code"]) == 9 and ticket["qr_text"]
    [png] = [b for b in started.content if isinstance(b, ImageContent)]
    assert base64.b64decode(png.data).startswith(b"\x89PNG")
    code, approved = realm_cli(owner, "approve", ticket["code"])
    assert code == 0 and approved["status"] == "approved", approved
    outcome = await call(client, "mesh_join_realm", {"realm": NAME, "wait_seconds": 30})
    assert outcome["status"] == "approved", outcome
    listed = await call(client, "mesh_list_realms")
    assert [r["name"] for r in listed["realms"]] == [NAME]
    return listed["realms"][0]


async def heard_while_said(
    listener: Client, speaker: Client, room: str, watch: dict[str, Any], text: str
) -> None:
    """``speaker`` says ``text`` (numbered) in ``room`` until ``listener``'s watch hears one."""
    watching = asyncio.create_task(
        listener.call_tool("mesh_watch", watch | {"duration_seconds": 20})
    )
    sent = 0
    while not watching.done():
        sent += 1
        await call(speaker, "mesh_say", {"room_topic": room, "text": f"{text} {sent}"})
        await asyncio.wait({watching}, timeout=0.5)
    heard = (await watching).structured_content
    assert heard is not None and len(heard["events"]) == 1, heard


def said(inbox: dict[str, Any], room: str) -> list[str]:
    return [m["text"] for r in inbox["rooms"] if r["room_topic"] == room for m in r["messages"]]


@pytest.mark.timeout(240)
async def test_a_realm_only_room_end_to_end(tmp_path: Path) -> None:
    owner = tmp_path / "owner"
    code, created = realm_cli(owner, "create", NAME)
    assert code == 0, created
    protect = f"{NAME}={created['authority']}"
    flags = ("--realm", protect, "--realm-sweep-ms", str(SWEEP_MS))
    with relay(tmp_path / "station", *flags) as station:
        async with (
            serve(owner, station),
            mcp(tmp_path / "ada", station, **OPEN_POLICY) as ada,
            mcp(tmp_path / "bob", station, **OPEN_POLICY) as bob,
            mcp(tmp_path / "eve", station, **OPEN_POLICY) as eve,
        ):
            ada_in = await join(ada, owner)
            bob_in = await join(bob, owner)
            assert ada_in["realm"] == bob_in["realm"] == realm_tag(NAME).hex()
            assert (await call(eve, "mesh_list_realms"))["realms"] == []
            hello = await call(ada, "mesh_hello", {"realm": NAME})  # her realm's lobby
            assert hello["realm"] == ada_in["realm"] and hello["realm_member"] == 1
            ada_id = hello["node_id"]
            bob_id = (await call(bob, "mesh_hello", {}))["node_id"]
            eve_id = (await call(eve, "mesh_hello", {}))["node_id"]

            # ada rings bob into a fresh room in the realm; bob (policy open) joins it there
            rung = await call(
                ada,
                "mesh_ring",
                {"to": bob_id, "purpose": "plan", "realm": NAME, "wait_join_seconds": 20},
            )
            room = rung["room_topic"]
            assert rung["answer"] == 1 and rung["joined"] == 1, rung
            assert rung["realm"] == ada_in["realm"] and rung["realm_member"] == 1
            rooms = (await call(bob, "mesh_rooms"))["joined"]
            assert [(r["room_topic"], r["realm"]) for r in rooms] == [(room, ada_in["realm"])]
            asked = await call(ada, "mesh_say", {"room_topic": room, "text": "ready?"})
            assert asked["realm_member"] == 1
            # every unread item comes back: ada's room_opened too when bob's catch-up on
            # joining fetched it around "ready?" (as in test_mcp_unread), so wait until it is
            heard_items: list[dict[str, Any]] = []
            for _ in range(3):
                heard = await call(bob, "mesh_wait_room", {"room_topic": room, "wait_seconds": 20})
                heard_items += heard["messages"]
                if any(m["message_id"] == asked["message_id"] for m in heard_items):
                    break
            others = {m["kind"] for m in heard_items if m["message_id"] != asked["message_id"]}
            assert "ready?" in [m["text"] for m in heard_items], heard_items
            assert others <= {"room_opened", "participant_joined"}, heard_items
            await call(bob, "mesh_say", {"room_topic": room, "text": "yes", "kind": "remark_made"})
            after = {
                "room_topic": room,
                "wait_seconds": 20,
                "after_message_id": asked["message_id"],
            }
            reply = await call(ada, "mesh_wait_room", after)
            assert reply["message"]["text"] == "yes" and reply["message"]["from"] == bob_id
            kept = await call(ada, "mesh_lobby_transcript", {"topic": room})
            assert {"ready?", "yes"} <= {m["text"] for m in kept["messages"]}

            # eve holds no membership: the station refuses her joining (a structured error)
            denied = await refused(eve, "mesh_join_room", {"room_topic": room, "realm": NAME})
            assert denied["code"] == "realm_refused" and "mesh_join_realm" in denied["next_action"]
            assert (await call(eve, "mesh_rooms"))["joined"] == []
            # a realm this station does not protect: allowed, with the hint that she holds no
            # membership of it; a realm argument that is neither a name nor 64 hex: refused
            elsewhere = await call(eve, "mesh_open_room", {"realm": "org.example.open"})
            assert elsewhere["realm_member"] == 0 and "silent" in elsewhere["realm_hint"]
            bad = await refused(eve, "mesh_open_room", {"realm": "Not A Realm"})
            assert bad["code"] == "invalid_argument"
            # on the wire she hears nothing of the room (her watch is refused, and says so at
            # once) while bob does
            watch = {"topic": room, "realm": NAME, "count": 1}
            eve_watch = await refused(eve, "mesh_watch", watch | {"duration_seconds": 600})
            assert eve_watch["code"] == "realm_refused", eve_watch
            await heard_while_said(bob, ada, room, watch, "members only")
            # what she publishes on the room's topic reaches nobody
            forged = {
                "message_id": "e" * 32,
                "room_topic": room,
                "sent_at": int(time.time() * 1000),
                "from": eve_id,
                "kind": "remark_made",
                "text": "eve was here",
            }
            forging = {"topic": room, "realm": NAME, "fact": forged}
            assert (await refused(eve, "mesh_publish", forging))["code"] == "realm_refused"
            await call(bob, "mesh_say", {"room_topic": room, "text": "after eve"})

            async def ada_heard_after_eve() -> dict[str, Any] | None:
                box = await call(ada, "mesh_read_inbox", {"peek": 1})
                return box if "after eve" in said(box, room) else None

            assert "eve was here" not in said(
                await eventually(ada_heard_after_eve, 20, interval=0.1), room
            )

            # the owner revokes bob: within the sweep the station refuses him
            code, revoked = realm_cli(owner, "revoke", bob_id)
            assert code == 0 and revoked["status"] == "revoked", revoked

            async def bob_refused() -> dict[str, Any] | None:
                result = await bob.call_tool("mesh_say", {"room_topic": room, "text": "still?"})
                return result.structured_content if result.is_error else None

            error = await eventually(bob_refused, 20, interval=0.1)
            assert error["code"] == "realm_refused", error
            late = await refused(bob, "mesh_watch", watch | {"duration_seconds": 600})
            assert late["code"] == "realm_refused", late
            # ada talks until her own watch hears it: the station fanned it out, not to bob
            await heard_while_said(ada, ada, room, watch, "after revoke")
            box = await call(bob, "mesh_read_inbox", {"peek": 1})
            late_heard = [t for t in said(box, room) if t.startswith("after revoke")]
            assert late_heard == [] and ada_id != bob_id
