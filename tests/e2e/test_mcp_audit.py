"""The audit trail seen from outside: a real ``macula-mcp`` (official SDK client, stdio) makes
tool calls and receives a task and a ring from another real agent through a real station;
``mesh_audit`` shows each with digests and no content, and the owner's ``audit verify`` passes
afterwards."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mcp import Client

from macula.agent.audit import audit_dir
from macula.keyfile import load_identity
from relay.station.station import Station
from support.mcpkit import StrictTools, cli, server_env, server_params
from support.waiting import eventually

pytestmark = pytest.mark.anyio
SECRET = "plum-velvet-4711"  # said in arguments and task content, never in the trail


async def test_mesh_audit_shows_calls_and_a_received_task_without_content(
    tmp_path: Path, station: Station
) -> None:
    bob_env = server_env(tmp_path / "bob", station.endpoint, MACULA_MCP_CONTACT_POLICY="open")
    alice_env = server_env(tmp_path / "alice", station.endpoint)
    async with (
        Client(server_params(bob_env)) as bob_client,
        Client(server_params(alice_env)) as alice_client,
    ):
        bob, alice = StrictTools(bob_client), StrictTools(alice_client)
        bob_id = (await bob.good("mesh_hello", message=f"bob {SECRET}"))["node_id"]
        alice_id = (await alice.good("mesh_hello"))["node_id"]
        await bob.bad("mesh_say", room_topic="not-a-room", text=SECRET)
        await alice.good("mesh_task_send", to=bob_id, title="t", input=f"do {SECRET}")

        async def received() -> list[dict[str, object]]:
            page = await bob.good("mesh_audit", kind="task_received")
            return list(page["entries"])

        (task,) = await eventually(received, 10, interval=0.05)
        assert task["outcome"] == "accepted"
        facts = task["facts"]
        assert isinstance(facts, dict) and facts["sender"] == alice_id
        assert len(str(facts["content_digest"])) == 64
        rung = await alice.good("mesh_ring", to=bob_id, purpose=f"about {SECRET}")
        assert rung["answer"] == 1, rung
        (ring,) = (await bob.good("mesh_audit", kind="ring_received"))["entries"]
        assert ring["outcome"] == "accepted" and ring["facts"]["caller"] == alice_id
        assert ring["facts"]["ring_id"] == rung["ring_id"]
        page = await bob.good("mesh_audit", kind="tool_called")
        called = [(e["facts"]["name"], e["outcome"]) for e in page["entries"]]
        assert called[:2] == [("mesh_hello", "ok"), ("mesh_say", "invalid_argument")], called
        assert all(len(e["facts"]["args_digest"]) == 64 for e in page["entries"])
        first = await bob.good("mesh_audit", limit=1)
        assert first["entries"][0]["seq"] == 1 and first["remaining"] >= 2
        assert first["next_page"]["arguments"]["cursor"] == "a1"
        following = await bob.good("mesh_audit", **first["next_page"]["arguments"])
        assert following["entries"][0]["seq"] == 2
        everything = await bob.good("mesh_audit", limit=200)
        assert SECRET not in json.dumps(everything)
    trail = audit_dir(tmp_path / "bob", load_identity(tmp_path / "bob" / "id.key").node_id)
    on_disk = b"".join(path.read_bytes() for path in trail.iterdir() if path.is_file())
    assert SECRET.encode() not in on_disk
    verified = cli(["audit", "verify"], bob_env)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert verified.stdout.startswith("intact: seq 1..")
