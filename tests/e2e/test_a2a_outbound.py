"""Outbound A2A end to end: a real ``macula-mcp`` over stdio (official MCP SDK client) on a real
station hands tasks with ``mesh_task_send`` to an A2A agent of the SDK's own kind (``a2a-sdk``
server, uvicorn on 127.0.0.1) listed in ``$MACULA_HOME/owner.toml``, and follows them with the
same task tools: result, input-required round trip, cancel, the agent's failures; an unlisted
URL is refused with no connection made; a malformed allowlist refuses everything."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from relay.station.station import Station
from support.a2akit import a2a_agent, bound_socket, broken_agent, counting_listener
from support.mcpkit import StrictTools, kill, killable_server, server_env

pytestmark = pytest.mark.anyio


def allow(home: Path, *urls: str, extra: str = "") -> None:
    home.mkdir(parents=True, exist_ok=True)
    path = home / "owner.toml"
    listed = ", ".join(f'"{u}"' for u in urls)
    path.write_text(f"{extra}[a2a]\nagents = [{listed}]\n")
    os.chmod(path, 0o600)


async def outcome(tools: StrictTools, task_id: str) -> dict[str, Any]:
    """The task once it is terminal, followed with ``mesh_task_wait`` (each change at most
    once: the loop is bounded by the states a task can pass through)."""
    for _ in range(20):
        task = (await tools.good("mesh_task_wait", task_id=task_id, wait_seconds=20))["task"]
        if task["terminal"]:
            return dict(task)
    raise AssertionError(f"task {task_id} never ended")


@asynccontextmanager
async def mesh_agent(home: Path, station: Station) -> AsyncIterator[StrictTools]:
    async with killable_server(home, server_env(home, station.endpoint)) as tools:
        yield tools


async def test_a_task_handed_to_an_a2a_agent_completes(tmp_path: Path, station: Station) -> None:
    home = tmp_path / "alice"
    async with a2a_agent() as helper:
        allow(home, helper.url)
        async with mesh_agent(home, station) as alice:
            sent = await alice.good(
                "mesh_task_send",
                to=helper.url,
                title="say it back",
                input="echo hello there",
                idempotency_key="s1",
            )
            task_id = sent["task_id"]
            assert sent["a2a_agent"] == helper.url and sent["peer_petname"] is None
            assert sent["delivered"] == 1
            moved = await alice.good(
                "mesh_task_wait", task_id=task_id, wait_seconds=20, after_state_seq=1
            )
            assert moved["changed"] == 1 and moved["task"]["state_seq"] > 1
            task = await outcome(alice, task_id)
            assert (task["state"], task["terminal"], task["result"]) == (
                "completed",
                1,
                "done: hello there",
            )
            got = await alice.good("mesh_task_get", task_id=task_id)
            assert [h["state"] for h in got["history"]][-1] == "completed"
            assert got["history"][0]["state"] == "submitted"
            listed = await alice.good("mesh_task_list", role="requester")
            assert [(t["task_id"], t["a2a_agent"]) for t in listed["tasks"]] == [
                (task_id, helper.url)
            ]
            again = await alice.good(
                "mesh_task_send",
                to=helper.url,
                title="say it back",
                input="echo hello there",
                idempotency_key="s1",
            )
            assert (again["task_id"], again["replayed"]) == (task_id, 1)
            assert helper.seen.inputs == ["echo hello there"]  # the replay dialled nobody
            assert helper.seen.titles == ["say it back"]
            late = await alice.bad("mesh_task_cancel", task_id=task_id)
            assert late["code"] == "already_terminal"


async def test_an_agent_that_does_not_stream_is_polled(tmp_path: Path, station: Station) -> None:
    home = tmp_path / "alice"
    async with a2a_agent(streaming=False) as helper, a2a_agent(secured=True) as locked:
        allow(home, helper.url, locked.url)
        async with mesh_agent(home, station) as alice:
            sent = await alice.good("mesh_task_send", to=helper.url, title="t", input="echo polled")
            assert (await outcome(alice, sent["task_id"]))["result"] == "done: polled"
            refused = await alice.bad("mesh_task_send", to=locked.url, title="t", input="echo x")
            assert refused["code"] == "a2a_auth_required" and refused.get("task") is None
            assert locked.seen.inputs == []


async def test_input_required_round_trip_and_cancel(tmp_path: Path, station: Station) -> None:
    home = tmp_path / "alice"
    async with a2a_agent() as helper:
        allow(home, helper.url)
        async with mesh_agent(home, station) as alice:
            sent = await alice.good(
                "mesh_task_send", to=helper.url, title="paint", input="ask", wait_seconds=20
            )
            task_id = sent["task_id"]
            assert (sent["state"], sent["note"]) == ("input_required", "which colour?")
            allow(home)  # the owner takes the agent off the list: nothing more goes to it
            off = await alice.bad("mesh_task_send", task_id=task_id, input="blue")
            assert (off["code"], off["task"]["state"]) == ("a2a_not_allowlisted", "input_required")
            allow(home, helper.url)
            answered = await alice.good(
                "mesh_task_send", task_id=task_id, input="blue", wait_seconds=20
            )
            assert answered["state"] in ("working", "completed")
            assert (await outcome(alice, task_id))["result"] == "colour: blue"
            assert helper.seen.inputs == ["ask", "blue"]

            held = await alice.good(
                "mesh_task_send", to=helper.url, title="wait", input="hold", wait_seconds=20
            )
            assert (held["state"], held["note"]) == ("working", "holding")
            canceled = await alice.good("mesh_task_cancel", task_id=held["task_id"], reason="no")
            assert (canceled["state"], canceled["terminal"]) == ("canceled", 1)
            assert canceled["cancel_requested"] == 1 and helper.seen.canceled == 1
            no_input = await alice.bad("mesh_task_send", task_id=held["task_id"], input="x")
            assert no_input["code"] == "already_terminal"


async def test_the_agents_failures_end_the_task_with_a_note(
    tmp_path: Path, station: Station
) -> None:
    home = tmp_path / "alice"
    async with a2a_agent() as helper, broken_agent(b'{"jsonrpc": "2.0", "id": 7}') as broken:
        allow(home, helper.url, broken)
        async with mesh_agent(home, station) as alice:
            outcomes = {}
            for word in ("fail", "reject", "auth", "flood"):
                sent = await alice.good(
                    "mesh_task_send", to=helper.url, title=word, input=word, wait_seconds=20
                )
                outcomes[word] = sent
            assert (outcomes["fail"]["state"], outcomes["fail"]["error"]) == (
                "failed",
                "cannot do it",
            )
            assert outcomes["reject"]["state"] == "failed"
            assert outcomes["reject"]["error"].startswith("refused: the A2A agent rejected")
            assert outcomes["auth"]["state"] == "failed"
            assert "authentication" in outcomes["auth"]["error"]
            flood = outcomes["flood"]
            assert flood["state"] == "completed"
            assert len(flood["result"].encode()) <= 16 * 1024
            assert flood["result"].endswith("more bytes]")

            refused = await alice.bad("mesh_task_send", to=broken, title="t", input="echo x")
            assert refused["code"] == "a2a_malformed_answer"
            assert refused["task"]["state"] == "failed"
            assert refused["task"]["error"].startswith("a2a_malformed_answer")


async def test_unlisted_urls_and_bad_allowlists_dial_nothing(
    tmp_path: Path, station: Station
) -> None:
    home = tmp_path / "alice"
    async with counting_listener() as listener:
        allow(home, "http://127.0.0.1:9/elsewhere")
        async with mesh_agent(home, station) as alice:
            refused = await alice.bad("mesh_task_send", to=listener.url, title="t", input="x")
            assert refused["code"] == "a2a_not_allowlisted"
            assert str(home / "owner.toml") in refused["detail"]
            named = await alice.bad("mesh_task_send", to="a2a:nobody", title="t", input="x")
            assert named["code"] == "a2a_not_allowlisted"

            (home / "owner.toml").write_text(f'[a2a]\nagents = ["{listener.url}"]\nurls = 1\n')
            malformed = await alice.bad("mesh_task_send", to=listener.url, title="t", input="x")
            assert malformed["code"] == "a2a_allowlist_invalid"
            assert "owner.toml" in malformed["detail"] and "a2a.urls" in malformed["detail"]

            os.chmod(home / "owner.toml", 0o666)
            allow_all = f'[a2a]\nagents = ["{listener.url}"]\n'
            (home / "owner.toml").write_text(allow_all)
            os.chmod(home / "owner.toml", 0o666)
            loose = await alice.bad("mesh_task_send", to=listener.url, title="t", input="x")
            assert loose["code"] == "a2a_allowlist_invalid" and "chmod 600" in loose["detail"]
            assert listener.connections == 0

            dead = bound_socket()  # a port nothing listens on
            dead_url = f"http://127.0.0.1:{dead.getsockname()[1]}/"
            dead.close()
            allow(home, dead_url)
            unreachable = await alice.bad("mesh_task_send", to=dead_url, title="t", input="x")
            assert (unreachable["code"], unreachable["retryable"]) == ("a2a_unreachable", 1)
            assert unreachable.get("task") is None  # no task was made
            assert (await alice.good("mesh_task_list"))["count"] == 0


async def test_a_task_survives_a_restart_of_the_mesh_agent(
    tmp_path: Path, station: Station
) -> None:
    home = tmp_path / "alice"
    async with a2a_agent() as helper:
        allow(home, helper.url)
        async with mesh_agent(home, station) as alice:
            sent = await alice.good(
                "mesh_task_send", to=helper.url, title="paint", input="ask", wait_seconds=20
            )
            task_id = sent["task_id"]
            assert sent["state"] == "input_required"
            kill(home)
        async with mesh_agent(home, station) as alice:
            answered = await alice.good("mesh_task_send", task_id=task_id, input="red")
            assert answered["a2a_agent"] == helper.url
            assert (await outcome(alice, task_id))["result"] == "colour: red"
