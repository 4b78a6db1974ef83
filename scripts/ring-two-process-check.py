"""Live check: rings between agents in separate processes, through a station.

An ``open`` callee and an ``ask`` callee run in their own processes (each a Node + Agent with
its own identity and stores); a caller process rings them. Checks: the open callee accepts (1),
has joined the room, and a question reaches it; the ask callee defers (3, pending), then answers
1 and the caller is notified and sees participant_joined; a node nobody serves is unreachable;
a ring whose proof was signed for another procedure is declined as unverified.

``uv run python scripts/ring-two-process-check.py [--station node_id@host:port]``
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from livecheck import (
    REPO,
    Checks,
    LocalStation,
    ScriptChild,
    check_main,
    child_args,
    plain,
    serve_ops,
    stdin_lines,
)


class AgentChild(ScriptChild):
    """An agent process: ``ring-two-process-check.py child``; JSON lines in and out."""

    def __init__(self, name: str, station: str, workdir: Path, policy: str) -> None:
        super().__init__(__file__, name, station, workdir, "--policy", policy)


def body(checks: Checks, station: LocalStation | None, workdir: Path, endpoint: str) -> None:
    caller = AgentChild("caller", endpoint, workdir, "ask")
    open_callee = AgentChild("open_callee", endpoint, workdir, "open")
    ask_callee = AgentChild("ask_callee", endpoint, workdir, "ask")
    children = (caller, open_callee, ask_callee)
    try:
        ids = {c.name: c.request("hello").get("node_id", "") for c in children}
        checks.check(
            "three agent processes present, each with its own identity", len(set(ids.values())) == 3
        )
        rung = caller.request("ring", to=ids["open_callee"], purpose="review the plan")
        checks.check(
            "ring the open callee: answer 1 (accepted)", rung.get("answer") == 1, str(rung)[:120]
        )
        checks.check("the open callee joined the room before answering", rung.get("joined") == 1)
        room = rung.get("room_topic", "")
        caller.request("say", room=room, kind="question_asked", text="does the plan hold?")
        heard = open_callee.request("wait", room=room, seconds=10, kind="question_asked")
        checks.check(
            "a question reaches the open callee (attested)",
            heard.get("message", {}).get("text") == "does the plan hold?"
            and heard["message"].get("attested") == 1,
        )
        deferred = caller.request("ring", to=ids["ask_callee"], purpose="pair on a bug")
        checks.check(
            "ring the ask callee: answer 3 (deferred)",
            deferred.get("answer") == 3,
            str(deferred)[:120],
        )
        pending = ask_callee.request("pending")
        ring_ids = [r["ring_id"] for r in pending.get("rings", [])]
        checks.check("the ring is pending at the ask callee", deferred.get("ring_id") in ring_ids)
        answered = ask_callee.request("answer", ring_id=deferred.get("ring_id"), answer=1)
        checks.check(
            "the ask callee answers 1 and the caller is notified",
            answered.get("caller_notified") == 1,
            str(answered)[:120],
        )
        joined = caller.request(
            "wait",
            room=deferred.get("room_topic", ""),
            seconds=10,
            kind="participant_joined",
            sender=ids["ask_callee"],
        )
        checks.check(
            "the caller sees the ask callee's participant_joined", joined.get("message") is not None
        )
        ghost = caller.request("ring", to=os.urandom(32).hex(), purpose="anyone?")
        checks.check(
            "ring a node nobody serves: unreachable",
            ghost.get("unreachable") == 1,
            str(ghost)[:120],
        )
        forged = caller.request("forged_ring", to=ids["open_callee"])
        checks.check(
            "a ring proven for another procedure is declined as unverified",
            forged.get("answer") == 2 and "unverified" in str(forged.get("reason")),
            str(forged)[:120],
        )
    finally:
        for child in children:
            child.close()


# --- the agent process ----------------------------------------------------------------------


async def _child(station: str, home: Path, policy: str) -> None:
    sys.path.insert(0, str(REPO))
    from macula.agent.agent import Agent, AgentSettings
    from macula.agent.proof import build_ring, make_proof, ring_endpoint
    from macula.errors import MaculaError
    from macula.keyfile import load_or_create_identity
    from macula.node.node import Node
    from macula.wire.identity import ZERO_REALM

    home.mkdir(parents=True, exist_ok=True)
    (home / "contact_policy.json").write_text(json.dumps({"contact_policy": policy}))
    env = {"MACULA_HOME": str(home)}
    identity = load_or_create_identity(home / "identity.key")
    reader = await stdin_lines()

    async with Node(identity, [station]) as node, Agent(node, AgentSettings.from_env(env)) as agent:

        async def forged_ring(to: str) -> dict[str, Any]:
            callee = bytes.fromhex(to)
            room = (await agent.rooms.open("forged")).room_topic
            now = agent.clock()
            payload = dict(build_ring(identity, callee, "x", room, "forged1", now))
            payload["proof"] = dict(
                make_proof(identity, ring_endpoint(callee) + "#ring:another", now)
            )
            return dict(await node.call(ZERO_REALM, ring_endpoint(callee), payload))

        ops = {
            "hello": lambda a: agent.hello(),
            "ring": lambda a: _fields(agent.rings.ring(bytes.fromhex(a["to"]), a["purpose"])),
            "say": lambda a: _fields(agent.rooms.say(a["room"], a["kind"], a["text"])),
            "pending": lambda a: _wrap("rings", agent.rings.pending()),
            "answer": lambda a: _fields(agent.rings.answer_ring(a["ring_id"], a["answer"])),
            "wait": lambda a: _wrap(
                "message",
                agent.rooms.wait(
                    a["room"], a["seconds"], after_ms=0, kinds={a["kind"]}, sender=a.get("sender")
                ),
            ),
            "forged_ring": lambda a: forged_ring(a["to"]),
        }
        await serve_ops(reader, ops, (MaculaError, KeyError, ValueError))


async def _wrap(key: str, work: Any) -> dict[str, Any]:
    return {key: plain(await work)}


async def _fields(work: Any) -> dict[str, Any]:
    """A typed result of the agent layer as JSON-ready fields."""
    fields = plain(await work)
    assert isinstance(fields, dict)
    return fields


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "child":
        args = child_args("policy")
        asyncio.run(_child(args.station, args.home, args.policy))
        return
    check_main(__doc__ or "", body)


if __name__ == "__main__":
    main()
