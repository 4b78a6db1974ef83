"""docs/two-machines.md run end to end on loopback: a station started by hand from the command
``macula-mcp station init`` prints, two laptops (two throwaway HOMEs, each its own MACULA_HOME)
given the printed ``MACULA_MESH_STATIONS`` line, each registered with ``register --attach`` in
its own (throwaway) Cursor configuration, then started from exactly the entry register wrote, as
the harness would start it, and driven by the official MCP SDK client: each sees the other in
``mesh_agents``, and a message said in their room arrives.

Invariants: 127.0.0.1 only; every process started here is stopped on leaving (the station
SIGKILLed if still running, each home's daemon stopped); no fixed sleeps (conditions polled
with a deadline)."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, StdioServerParameters

from macula.quic.backend import ENV as QUIC_ENV
from support.mcpkit import good, stop_daemon_for_good
from support.processkit import free_udp_port
from support.waiting import eventually
from tools.local_station.process import relay_environment

pytestmark = pytest.mark.anyio


def mcp(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``macula-mcp ARGS`` (the installed script), as a person types it."""
    script = Path(sys.executable).with_name("macula-mcp")
    return subprocess.run(
        [str(script), *args], capture_output=True, text=True, timeout=120, env=env, check=False
    )


def laptop_env(root: Path, name: str, stations_line: str) -> dict[str, str]:
    """A laptop: its own HOME (with a Cursor folder, so register finds one harness) and
    MACULA_HOME, and the line the station's owner handed over."""
    home = root / name
    (home / ".cursor").mkdir(parents=True)
    key, value = stations_line.split("=", 1)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MACULA_")}
    return env | {
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "MACULA_HOME": str(home / ".macula"),
        "MACULA_MCP_AGENT": name,
        key: value,
    }


def registered_entry(env: dict[str, str]) -> dict[str, Any]:
    config = json.loads((Path(env["HOME"]) / ".cursor" / "mcp.json").read_text())
    return dict(config["mcpServers"]["macula"])


@asynccontextmanager
async def hand_started_station(command: list[str]) -> AsyncIterator[str]:
    """The printed ``macula-relay`` command line, started as typed (plus a free DHT port and
    quiet logs); the line it prints once it listens."""
    env = {k: v for k, v in relay_environment(os.environ).items() if k != QUIC_ENV}
    process = await asyncio.create_subprocess_exec(
        *command,
        "--dht-port",
        "0",
        "--log-level",
        "warning",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
        env=env,
    )
    try:
        assert process.stdout is not None
        line = await asyncio.wait_for(process.stdout.readline(), 30)
        yield line.decode().strip()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def test_two_laptops_meet_through_a_hand_started_station(tmp_path: Path) -> None:
    vps = {k: v for k, v in os.environ.items() if not k.startswith("MACULA_")}
    vps["MACULA_HOME"] = str(tmp_path / "vps")
    port = free_udp_port()
    init = mcp(
        ["station", "init", "--public", "127.0.0.1", "--port", str(port), "--host", "127.0.0.1"],
        vps,
    )
    assert init.returncode == 0, init.stderr
    text = init.stdout
    relay_line = next(line for line in text.splitlines() if "macula-relay --host" in line)
    stations_line = next(
        line.split("export ", 1)[1] for line in text.splitlines() if "export " in line
    )
    pinned = stations_line.split("=", 1)[1]
    laptops = [laptop_env(tmp_path, name, stations_line) for name in ("ada", "bob")]
    async with hand_started_station(shlex.split(relay_line)) as printed:
        assert printed == pinned  # the id station init pinned is the station's real key
        try:
            for env in laptops:
                done = mcp(["register", "--attach"], env)
                assert done.returncode == 0, done.stderr
                assert f"copied {stations_line}" in done.stdout, done.stdout
                assert registered_entry(env)["env"] == {"MACULA_MESH_STATIONS": pinned}
            doctor = mcp(["doctor"], laptops[0])
            assert "[FAIL] station" not in doctor.stdout, doctor.stdout
            assert "QUIC handshake ok; key matches its pin" in doctor.stdout, doctor.stdout
            await _meet(laptops)
        finally:
            for env in laptops:
                stop_daemon_for_good(Path(env["MACULA_HOME"]))


def _as_harness_starts_it(env: dict[str, str]) -> StdioServerParameters:
    entry = registered_entry(env)
    assert entry["args"][-1:] == ["attach"]
    return StdioServerParameters(
        command=entry["command"], args=entry["args"], env=env | entry["env"]
    )


async def _meet(laptops: list[dict[str, str]]) -> None:
    ada_env, bob_env = laptops
    ada_env["MACULA_MCP_CONTACT_POLICY"] = "ask"  # ada answers bob's ring herself
    async with (
        Client(_as_harness_starts_it(ada_env)) as ada,
        Client(_as_harness_starts_it(bob_env)) as bob,
    ):
        ada_id = (await good(ada, "mesh_hello", operator_name="ada"))["node_id"]
        bob_id = (await good(bob, "mesh_hello", operator_name="bob"))["node_id"]

        async def sees(client: Client, other: str) -> bool:
            listed = (await good(client, "mesh_agents"))["agents"]
            return any(agent["node_id"] == other for agent in listed)

        await eventually(lambda: sees(ada, bob_id), 20, interval=0.1)
        await eventually(lambda: sees(bob, ada_id), 20, interval=0.1)
        rung = await good(bob, "mesh_ring", to=ada_id, purpose="two machines, one room")
        inbox = await good(ada, "mesh_read_inbox")
        assert [r["ring_id"] for r in inbox["rings"]["pending"]] == [rung["ring_id"]]
        await good(ada, "mesh_answer_ring", ring_id=rung["ring_id"], answer=1)
        room = rung["room_topic"]
        said = await good(bob, "mesh_say", room_topic=room, kind="question_asked", text="hi ada")

        async def heard() -> list[dict[str, Any]]:
            inbox = await good(ada, "mesh_read_inbox")
            return [
                message
                for listed in inbox["rooms"]
                if listed["room_topic"] == room
                for message in listed["messages"]
                if message.get("message_id") == said["message_id"]
            ]

        [message] = await eventually(heard, 20, interval=0.1)
        assert message["text"] == "hi ada"
