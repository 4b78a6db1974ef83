"""``macula-mcp demo``: two agents meet on a local station, each a real ``macula-mcp``
subprocess driven by the official MCP SDK client, exactly as a harness would drive it.

Steps: both say hello and see each other; ada rings bob (bob's policy: open) and they talk in
the room; bob serves a procedure that ada calls; ada shares an artifact bob fetches. A readable
transcript on the terminal; exit 0 only if every step worked.
"""

from __future__ import annotations

import asyncio
import base64
import os
import sys
import tempfile
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

from mcp import Client, StdioServerParameters

from relay.station import Station, StationConfig
from tools.cli import server_command


class Failed(Exception):
    pass


class Agent:
    def __init__(self, name: str, client: Client) -> None:
        self.name = name
        self.client = client

    async def __call__(self, tool: str, **args: Any) -> dict[str, Any]:
        result = await self.client.call_tool(tool, args)
        data = dict(result.structured_content or {})
        if result.is_error:
            raise Failed(f"{self.name}: {tool} failed: {data.get('code')}: {data.get('detail')}")
        return data


@asynccontextmanager
async def agent(name: str, home: Path, station: str, policy: str) -> AsyncIterator[Agent]:
    command = server_command()
    env = dict(
        os.environ,
        MACULA_HOME=str(home),
        MACULA_MESH_STATIONS=station,
        MACULA_MCP_AGENT=name,
        MACULA_MCP_OPERATOR_NAME=name,
        MACULA_MCP_CONTACT_POLICY=policy,
    )
    params = StdioServerParameters(command=command[0], args=command[1:], env=env)
    async with Client(params) as client:
        yield Agent(name, client)


def say(who: str, text: str) -> None:
    print(f"  {who:>4} | {text}", flush=True)


async def run(workdir: Path) -> None:
    async with (
        Station(StationConfig(data_dir=workdir / "station", port=0)) as station,
        AsyncExitStack() as stack,
    ):
        print(f"station {station.endpoint}", flush=True)
        bob = await stack.enter_async_context(
            agent("bob", workdir / "bob", station.endpoint, "open")
        )
        bob_id = (await bob("mesh_hello", message="happy to review plans"))["node_id"]
        ada = await stack.enter_async_context(
            agent("ada", workdir / "ada", station.endpoint, "ask")
        )
        ada_id = (await ada("mesh_hello", message="looking for a reviewer"))["node_id"]
        await bob("mesh_hello", message="happy to review plans")  # re-announce so ada hears bob now
        for _ in range(50):
            seen = (await ada("mesh_agents"))["agents"]
            if any(a["node_id"] == bob_id for a in seen):
                break
            await asyncio.sleep(0.1)
        else:
            raise Failed("ada never saw bob in mesh_agents")
        bob_name = next(a["petname"] for a in seen if a["node_id"] == bob_id)
        say("ada", f"mesh_agents: I see {bob_name} ({bob_id[:12]}…): 'happy to review plans'")
        rung = await ada("mesh_ring", to=bob_name, purpose="review my plan")
        if rung.get("answer") != 1 or rung.get("joined") != 1:
            raise Failed(f"ring not accepted and joined: {rung}")
        room = rung["room_topic"]
        say("ada", f"mesh_ring {bob_name}: answer 1 (accepted), joined 1, room {room[:24]}…")
        listening = asyncio.create_task(bob("mesh_wait_room", room_topic=room, wait_seconds=10))
        await asyncio.sleep(0.3)  # bob waits before ada speaks: nothing to poll for
        asked = await ada(
            "mesh_say", room_topic=room, kind="question_asked", text="Is step 2 safe?"
        )
        heard = await listening
        message = heard.get("message") or {}
        if message.get("text") != "Is step 2 safe?":
            raise Failed(f"bob did not hear the question: {heard}")
        say("bob", f"heard: {message['text']!r} (attested {message.get('attested')})")
        reply = await bob(
            "mesh_say",
            room_topic=room,
            kind="answer_given",
            text="Yes, if you lock first.",
            in_reply_to=asked["message_id"],
        )
        say("bob", f"answered in reply to {asked['message_id'][:8]}… ({reply['message_id'][:8]}…)")
        inbox = await ada("mesh_read_inbox")
        threaded = [m for r in inbox["rooms"] if r["room_topic"] == room for m in r["messages"]]
        answer = next((m for m in threaded if m["kind"] == "answer_given"), None)
        if answer is None or answer["depth"] != 1:
            raise Failed(f"the answer is not threaded under the question: {threaded}")
        say("ada", f"inbox: {answer['text']!r}, threaded at depth {answer['depth']}")
        script = "import json,sys; print(json.dumps({'sum': sum(json.load(sys.stdin)['numbers'])}))"
        echo = f'{sys.executable} -c "{script}"'
        await bob("mesh_serve", name="org.example.demo.sum_v1", exec=echo)
        await asyncio.sleep(0.3)
        called = await ada(
            "mesh_call", procedure="org.example.demo.sum_v1", args={"numbers": [1, 2, 3, 4]}
        )
        if called.get("result") != {"sum": 10}:
            raise Failed(f"served procedure answered {called}")
        say("ada", f"mesh_call sum_v1 [1,2,3,4] -> {called['result']} (bob's command answered)")
        artifact = os.urandom(9_000)  # results are bounded (~24 KB): big artifacts go peer to peer
        put = await ada("mesh_put", content=base64.b64encode(artifact).decode(), name="plan.bin")
        got = await bob("mesh_get", mcid_hex=put["mcid_hex"])
        if base64.b64decode(got.get("content_base64", "")) != artifact:
            raise Failed("bob fetched something else than ada put")
        say("bob", f"mesh_get {put['mcid_hex'][:20]}…: {put['size_bytes']} bytes, verified")
        _ = ada_id


def main() -> None:
    print(
        "macula-mcp demo: two agents (real macula-mcp processes) meet on a local station",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="macula-mcp-demo-") as tmp:
        try:
            asyncio.run(run(Path(tmp)))
        except* Failed as group:
            for exc in group.exceptions:
                print(f"FAILED: {exc}", flush=True)
            raise SystemExit(1) from None
    print(
        "demo passed: hello, agents, ring, room conversation, served call, shared artifact",
        flush=True,
    )


if __name__ == "__main__":
    main()
