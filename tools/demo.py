"""``macula-mcp demo``: two agents meet on a local station, each a real ``macula-mcp``
subprocess driven by the official MCP SDK client, exactly as a harness would drive it.

Steps: both say hello and see each other; ada rings bob (bob's policy: open) and they talk in
the room; bob serves a procedure that ada calls; ada shares an artifact bob fetches; then the
station process is stopped and started again (same key, same port) and both agents come back
by themselves (``mesh://status``: reconnects) and bob's procedure answers again with nothing
re-served. A readable transcript on the terminal; exit 0 only if every step worked.

Nothing sleeps to let the mesh settle: where one agent needs another's state, it polls a
condition with a deadline (``until``); a step that fails closes both servers and the station.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import sys
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

from mcp import Client, StdioServerParameters

from macula.config import AGENT_ENV, CONTACT_POLICY_ENV, HOME_ENV, OPERATOR_NAME_ENV, STATIONS_ENV
from tools.launch import server_command
from tools.local_station.process import StationProcessError, station_process

T = TypeVar("T")
POLL_S = 0.1  # between two looks at another agent's state
REPLY_WAIT_S = 10.0
RECONNECT_WAIT_S = 40.0  # a station start (a few s) plus the node's backoff (1, 2, 4, 8 s...)
SUM = "org.example.demo.sum_v1"


class Failed(Exception):
    pass


class Agent:
    def __init__(self, name: str, client: Client) -> None:
        self.name = name
        self.client = client

    async def raw(self, tool: str, **args: Any) -> tuple[bool, dict[str, Any]]:
        """``(failed, structured content)`` of one tool call."""
        result = await self.client.call_tool(tool, args)
        return bool(result.is_error), dict(result.structured_content or {})

    async def status(self) -> dict[str, Any]:
        """``mesh://status``, read afresh (never from the client's cache)."""
        found = await self.client.read_resource("mesh://status", cache_mode="bypass")
        text = getattr(found.contents[0], "text", "{}")
        return dict(json.loads(text))

    async def __call__(self, tool: str, **args: Any) -> dict[str, Any]:
        failed, data = await self.raw(tool, **args)
        if failed:
            raise Failed(f"{self.name}: {tool} failed: {data.get('code')}: {data.get('detail')}")
        return data


@asynccontextmanager
async def agent(name: str, home: Path, station: str, policy: str) -> AsyncIterator[Agent]:
    command = server_command()
    env = {
        **os.environ,
        HOME_ENV: str(home),
        STATIONS_ENV: station,
        AGENT_ENV: name,
        OPERATOR_NAME_ENV: name,
        CONTACT_POLICY_ENV: policy,
    }
    params = StdioServerParameters(command=command[0], args=command[1:], env=env)
    async with Client(params) as client:
        yield Agent(name, client)


def say(who: str, text: str) -> None:
    print(f"  {who:>4} | {text}", flush=True)


async def until(check: Callable[[], Awaitable[T | None]], what: str, timeout: float = 10.0) -> T:
    """Poll ``check`` until it returns something, or fail naming ``what`` at the deadline."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        found = await check()
        if found is not None:
            return found
        if loop.time() >= deadline:
            raise Failed(f"{what}: not within {timeout:g} s")
        await asyncio.sleep(POLL_S)


class Station:
    """The station process, which the demo can stop and start again on the same port."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.endpoint = ""
        self._running = AsyncExitStack()

    async def start(self, port: int = 0) -> str:
        try:  # the station runs through its entry point: tools never imports relay
            self.endpoint = await self._running.enter_async_context(
                station_process(self.data_dir, port=port)
            )
        except StationProcessError as exc:
            raise Failed(str(exc)) from None
        return self.endpoint

    async def restart(self) -> str:
        """Stop the station (it says goodbye to its clients) and start it on the same port."""
        before = self.endpoint
        await self._running.aclose()
        after = await self.start(int(before.rsplit(":", 1)[1]))
        if after != before:
            raise Failed(f"the restarted station is {after}, not {before}")
        return after

    async def __aenter__(self) -> Station:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._running.aclose()


async def run(workdir: Path) -> None:
    """Every step; whatever fails closes (and cancels) all that was started before it."""
    async with AsyncExitStack() as stack:
        station = await stack.enter_async_context(Station(workdir / "station"))
        print(f"station {station.endpoint}", flush=True)
        bob = await stack.enter_async_context(
            agent("bob", workdir / "bob", station.endpoint, "open")
        )
        ada = await stack.enter_async_context(
            agent("ada", workdir / "ada", station.endpoint, "ask")
        )
        bob_name = await meet(ada, bob)
        rung = await ada("mesh_ring", to=bob_name, purpose="review my plan")
        if rung.get("answer") != 1 or rung.get("joined") != 1:
            raise Failed(f"ring not accepted and joined: {rung}")
        room = rung["room_topic"]
        say("ada", f"mesh_ring {bob_name}: answer 1 (accepted), joined 1, room {room[:24]}…")
        await converse(ada, bob, room)
        await serve_and_call(ada, bob)
        await share(ada, bob)
        await ride_out_restart(station, ada, bob)


async def meet(ada: Agent, bob: Agent) -> str:
    """Both say hello; ada sees bob in ``mesh_agents``. Returns bob's petname for ada."""
    bob_id = (await bob("mesh_hello", message="happy to review plans"))["node_id"]
    await ada("mesh_hello", message="looking for a reviewer")
    await bob("mesh_hello", message="happy to review plans")  # re-announce so ada hears bob now

    async def bob_seen() -> dict[str, Any] | None:
        seen = (await ada("mesh_agents"))["agents"]
        return next((a for a in seen if a["node_id"] == bob_id), None)

    bob_name = str((await until(bob_seen, "ada never saw bob in mesh_agents"))["petname"])
    say("ada", f"mesh_agents: I see {bob_name} ({bob_id[:12]}…): 'happy to review plans'")
    return bob_name


async def serve_and_call(ada: Agent, bob: Agent) -> None:
    script = "import json,sys; print(json.dumps({'sum': sum(json.load(sys.stdin)['numbers'])}))"
    await bob("mesh_serve", name=SUM, exec=f'{sys.executable} -c "{script}"')
    called = await until(summer(ada), "bob's served procedure never became callable")
    say("ada", f"mesh_call sum_v1 [1,2,3,4] -> {called['result']} (bob's command answered)")


def summer(ada: Agent) -> Callable[[], Awaitable[dict[str, Any] | None]]:
    """ada's call of bob's procedure: None while it cannot reach bob (yet, or again)."""

    async def summed() -> dict[str, Any] | None:
        failed, called = await ada.raw("mesh_call", procedure=SUM, args={"numbers": [1, 2, 3, 4]})
        if failed and called.get("code") in ("unknown_next_peer", "not_connected"):
            return None  # bob's advertisement has not reached ada's side yet
        if failed or called.get("result") != {"sum": 10}:
            raise Failed(f"served procedure answered {called}")
        return called

    return summed


async def share(ada: Agent, bob: Agent) -> None:
    artifact = os.urandom(9_000)  # results are bounded (~24 KB): big artifacts go peer to peer
    put = await ada("mesh_put", content=base64.b64encode(artifact).decode(), name="plan.bin")
    got = await bob("mesh_get", mcid_hex=put["mcid_hex"])
    if base64.b64decode(got.get("content_base64", "")) != artifact:
        raise Failed("bob fetched something else than ada put")
    say("bob", f"mesh_get {put['mcid_hex'][:20]}…: {put['size_bytes']} bytes, verified")


async def ride_out_restart(station: Station, ada: Agent, bob: Agent) -> None:
    """The station stops and starts again; both agents come back without being told to."""
    print(f"station restarted {await station.restart()}", flush=True)
    for one in (ada, bob):

        async def back(one: Agent = one) -> dict[str, Any] | None:
            status = await one.status()
            return status if status.get("connected") == 1 and status["reconnects"] >= 1 else None

        status = await until(back, f"{one.name} never reconnected", RECONNECT_WAIT_S)
        say(one.name, f"mesh://status: connected 1, reconnects {status['reconnects']} (by itself)")
    called = await until(summer(ada), "bob's procedure never answered after the restart")
    say("ada", f"mesh_call sum_v1 after the restart -> {called['result']} (bob re-served nothing)")


async def converse(ada: Agent, bob: Agent, room: str) -> None:
    """ada asks and waits for the reply in the same call; bob finds the question and answers."""
    question = "Is step 2 safe?"

    async def heard() -> dict[str, Any] | None:
        inbox = await bob("mesh_read_inbox")
        messages = [m for r in inbox["rooms"] if r["room_topic"] == room for m in r["messages"]]
        return next((m for m in messages if m["kind"] == "question_asked"), None)

    async with asyncio.TaskGroup() as group:
        asking = group.create_task(
            ada(
                "mesh_say",
                room_topic=room,
                kind="question_asked",
                text=question,
                wait_reply_seconds=REPLY_WAIT_S,
            )
        )
        message = await until(heard, "bob never heard the question")
        if message.get("text") != question:
            raise Failed(f"bob heard something else: {message}")
        say("bob", f"heard: {message['text']!r} (attested {message.get('attested')})")
        reply = await bob(
            "mesh_say",
            room_topic=room,
            kind="answer_given",
            text="Yes, if you lock first.",
            in_reply_to=message["message_id"],
        )
        say(
            "bob", f"answered in reply to {message['message_id'][:8]}… ({reply['message_id'][:8]}…)"
        )
    answered = (asking.result().get("reply") or {}).get("message_id")
    if answered != reply["message_id"]:
        raise Failed(f"ada's question got no reply in the same call: {asking.result()}")
    thanks = await ada(
        "mesh_say", room_topic=room, text="Thanks, locking first.", in_reply_to=answered
    )

    async def threaded() -> dict[str, Any] | None:
        inbox = await bob("mesh_read_inbox")
        shown = [m for r in inbox["rooms"] if r["room_topic"] == room for m in r["messages"]]
        return next((m for m in shown if m["message_id"] == thanks["message_id"]), None)

    follow_up = await until(threaded, "bob never read ada's thanks")
    if follow_up["depth"] != 2:
        raise Failed(f"the thanks is not threaded under the answer: {follow_up}")
    say("bob", f"inbox: {follow_up['text']!r}, threaded at depth {follow_up['depth']}")


def _leaves(group: BaseExceptionGroup[Failed]) -> list[BaseException]:
    """The failures of a (possibly nested) exception group, in order."""
    found: list[BaseException] = []
    for exc in group.exceptions:
        found.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return found


def main() -> None:
    print(
        "macula-mcp demo: two agents (real macula-mcp processes) meet on a local station",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="macula-mcp-demo-") as tmp:
        try:
            asyncio.run(run(Path(tmp)))
        except* Failed as group:
            for exc in _leaves(group):
                print(f"FAILED: {exc}", flush=True)
            raise SystemExit(1) from None
    print(
        "demo passed: hello, agents, ring, room conversation, served call, shared artifact, "
        "station restart ridden out",
        flush=True,
    )


if __name__ == "__main__":
    main()
