"""Live check: a threaded conversation between two agent processes survives a killed agent and
a restarted station, through unread marks and catch-up from the station's room history.

alice and bob run in their own processes (each a Node + Agent with its own identity and home).
alice opens a room, bob joins; they trade questions and answers, each reply ``in_reply_to`` the
message before it, each side reading with the unread marks (an answer that came before the
wait is not lost). Then bob is killed (SIGKILL: no goodbye) while alice keeps asking, the
station is restarted (its history is on disk), and bob is restarted with the same home: he
catches up, and his next waits return alice's questions in order. Afterwards both transcripts
hold every envelope of the room exactly once, in the order each sender said them, no gap.

``uv run python scripts/conversation-two-process-check.py [--station node_id@host:port]``
(with an external station there is no station restart).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from livecheck import (
    REPO,
    Checks,
    LocalStation,
    ScriptChild,
    check_main,
    child_args,
    restart,
    serve_ops,
    stdin_lines,
)


class AgentChild(ScriptChild):
    """An agent process: ``conversation-two-process-check.py child``; JSON lines in and out."""

    def __init__(self, name: str, station: str, workdir: Path) -> None:
        super().__init__(__file__, name, station, workdir)


def body(checks: Checks, station: LocalStation | None, workdir: Path, endpoint: str) -> None:
    alice = AgentChild("alice", endpoint, workdir)
    bob = AgentChild("bob", endpoint, workdir)
    said: dict[str, list[str]] = {"alice": [], "bob": []}  # message ids, in the order said
    try:
        ids = {c.name: c.request("hello").get("node_id", "") for c in (alice, bob)}
        checks.check("two agent processes present, each with its own identity",
                     len(set(ids.values())) == 2 and all(ids.values()))  # fmt: skip
        opened = alice.request("open")
        room = opened.get("room_topic", "")
        said["alice"].append(opened.get("message_id", ""))
        joined = bob.request("join", room=room)
        said["bob"].append(joined.get("message_id") or "")
        bob.request("caught_up", runs=2, seconds=30)  # at hello, then on joining
        shown = bob.request("inbox", room=room)  # unread from others; marked read as shown
        checks.check(
            "bob, joining after alice opened the room, has its room_opened (caught up)",
            shown.get("kinds") == ["room_opened"],
            str(shown)[:160],
        )
        heard = alice.request("wait", room=room, seconds=20)
        checks.check(
            "alice's first unread is bob joining",
            heard.get("message", {}).get("kind") == "participant_joined",
            str(heard)[:160],
        )
        last = ""
        threaded = True
        for n in range(1, 4):
            last, ok = converse(alice, bob, room, n, last, said)
            threaded = threaded and ok
        checks.check("three questions answered, each reply in_reply_to the one before", threaded)

        checks.check("bob killed mid-conversation (SIGKILL)", bob.kill() != 0)
        for n in (4, 5):
            asked = alice.request(
                "say", room=room, kind="question_asked", text=f"q{n}", in_reply_to=last
            )
            last = asked.get("message_id", "")
            said["alice"].append(last)
        if restart(checks, station):
            back = alice.request("connected", seconds=30)
            checks.check("alice reconnected to the restarted station", back.get("connected") == 1)
        bob.restart()
        hello = bob.request("hello")
        checks.check("bob restarted with the same home and identity",
                     hello.get("node_id") == ids["bob"])  # fmt: skip
        caught = bob.request("caught_up", runs=1, seconds=30)
        checks.check("bob caught up from the station's history", caught.get("runs", 0) >= 1,
                     str(caught)[:160])  # fmt: skip
        first = bob.request("wait", room=room, seconds=20).get("message") or {}
        second = bob.request("wait", room=room, seconds=20).get("message") or {}
        checks.check(
            "bob's waits return what he missed, oldest first: q4 then q5",
            (first.get("text"), second.get("text")) == ("q4", "q5"),
            f"{first.get('text')!r}, {second.get('text')!r}",
        )
        checks.check("what bob missed verifies end to end (attested 1)",
                     first.get("attested") == 1 and second.get("attested") == 1)  # fmt: skip
        answer = bob.request("say", room=room, kind="answer_given", text="a5", in_reply_to=last)
        said["bob"].append(answer.get("message_id", ""))
        got = alice.request("wait", room=room, seconds=20, after=last).get("message") or {}
        checks.check("alice hears bob's answer after the restarts",
                     got.get("message_id") == answer.get("message_id"))  # fmt: skip
        last, ok = converse(alice, bob, room, 6, answer.get("message_id", ""), said)
        checks.check("the conversation goes on (q6, a6)", ok)
        final(checks, room, said, ids, alice, bob)
    finally:
        for child in (alice, bob):
            child.close()


def converse(
    alice: AgentChild, bob: AgentChild, room: str, n: int, last: str, said: dict[str, list[str]]
) -> tuple[str, bool]:
    """alice asks question ``n`` (in reply to ``last``), bob reads it unread and answers; alice
    reads the answer after her question. The answer's id, and whether all went as it should."""
    reply = {"in_reply_to": last} if last else {}
    asked = alice.request("say", room=room, kind="question_asked", text=f"q{n}", **reply)
    question = asked.get("message_id", "")
    said["alice"].append(question)
    heard = bob.request("wait", room=room, seconds=20).get("message") or {}
    answer = bob.request("say", room=room, kind="answer_given", text=f"a{n}", in_reply_to=question)
    said["bob"].append(answer.get("message_id", ""))
    time.sleep(0.2)  # the answer is already there when alice starts waiting
    got = alice.request("wait", room=room, seconds=20, after=question).get("message") or {}
    ok = (
        heard.get("message_id") == question
        and got.get("message_id") == answer.get("message_id")
        and got.get("in_reply_to") == question
    )
    return answer.get("message_id", ""), ok


def final(
    checks: Checks,
    room: str,
    said: dict[str, list[str]],
    ids: dict[str, str],
    alice: AgentChild,
    bob: AgentChild,
) -> None:
    everything = {mid for mids in said.values() for mid in mids}
    for child in (alice, bob):
        seen = child.request("transcript", room=room)
        rows = seen.get("messages", [])
        mids = [row["message_id"] for row in rows]
        checks.check(
            f"{child.name}'s inbox holds every envelope of the room exactly once",
            len(mids) == len(set(mids)) and set(mids) == everything,
            f"{len(mids)} rows, {len(set(mids))} distinct, {len(everything)} said",
        )
        in_order = all(
            [row["message_id"] for row in rows if row["from"] == ids[sender]] == said[sender]
            for sender in ("alice", "bob")
        )
        checks.check(f"{child.name}'s inbox has each sender's envelopes in order", in_order)
        checks.check(f"{child.name}'s inbox reports no gap", seen.get("gaps") == {},
                     str(seen.get("gaps")))  # fmt: skip


# --- the agent process ----------------------------------------------------------------------


async def _child(station: str, home: Path) -> None:
    sys.path.insert(0, str(REPO))
    from macula.agent.agent import Agent, AgentSettings
    from macula.client.backoff import Backoff
    from macula.errors import MaculaError
    from macula.keyfile import load_or_create_identity
    from macula.node.node import Node
    from macula.store.transcript import TranscriptMessage

    home.mkdir(parents=True, exist_ok=True)
    (home / "contact_policy.json").write_text(json.dumps({"contact_policy": "open"}))
    env = {"MACULA_HOME": str(home)}
    identity = load_or_create_identity(home / "identity.key")
    loop = asyncio.get_running_loop()
    reader = await stdin_lines()
    backoff = Backoff(initial_s=0.2, max_s=1.0)

    def view(message: TranscriptMessage | None) -> dict[str, Any] | None:
        if message is None:
            return None
        return {
            "message_id": message.message_id,
            "from": message.from_hex,
            "kind": message.kind,
            "text": message.text,
            "in_reply_to": message.in_reply_to,
            "attested": message.attested,
        }

    async with (
        Node(identity, [station], backoff=backoff) as node,
        Agent(node, AgentSettings.from_env(env)) as agent,
    ):
        rooms = agent.rooms

        async def hello(a: dict[str, Any]) -> dict[str, Any]:
            return dict(await agent.hello())

        async def open_room(a: dict[str, Any]) -> dict[str, Any]:
            opened = await rooms.open("conversation check")
            return {"room_topic": opened.room_topic, "message_id": opened.message_id}

        async def join(a: dict[str, Any]) -> dict[str, Any]:
            return {"message_id": (await rooms.join(a["room"])).message_id}

        async def say(a: dict[str, Any]) -> dict[str, Any]:
            said = await rooms.say(
                a["room"], a["kind"], a["text"], in_reply_to=a.get("in_reply_to")
            )
            return {"message_id": said.message_id}

        async def wait(a: dict[str, Any]) -> dict[str, Any]:
            found = await rooms.wait_unread(
                a["room"], a["seconds"], after_message_id=a.get("after")
            )
            return {"message": view(found)}

        async def connected(a: dict[str, Any]) -> dict[str, Any]:
            deadline = loop.time() + a["seconds"]
            while not node.connected and loop.time() < deadline:
                await asyncio.sleep(0.05)
            return {"connected": int(node.connected)}

        async def caught_up(a: dict[str, Any]) -> dict[str, Any]:
            deadline = loop.time() + a["seconds"]
            while loop.time() < deadline:
                catch_up = rooms.catch_up
                if catch_up is not None and catch_up.runs >= a["runs"] and not _busy(rooms):
                    return {"runs": catch_up.runs, "stats": dict(catch_up.stats)}
                await asyncio.sleep(0.05)
            return {"runs": 0}

        async def inbox(a: dict[str, Any]) -> dict[str, Any]:
            threads = (await rooms.inbox()).rooms
            shown = [m for t in threads if t.room_topic == a["room"] for m in t.messages]
            return {"kinds": [m["kind"] for m in shown]}

        async def transcript(a: dict[str, Any]) -> dict[str, Any]:
            messages = await rooms.transcript.messages(a["room"], limit=1000)
            return {
                "messages": [view(m) for m in messages],
                "gaps": await rooms.transcript.gaps(),
            }

        ops = {
            "hello": hello,
            "open": open_room,
            "join": join,
            "say": say,
            "wait": wait,
            "connected": connected,
            "caught_up": caught_up,
            "transcript": transcript,
            "inbox": inbox,
        }
        await serve_ops(reader, ops, (MaculaError, KeyError, ValueError))


def _busy(rooms: Any) -> bool:
    task = rooms._catching
    return task is not None and not task.done()


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "child":
        args = child_args()
        asyncio.run(_child(args.station, args.home))
        return
    check_main(__doc__ or "", body)


if __name__ == "__main__":
    main()
