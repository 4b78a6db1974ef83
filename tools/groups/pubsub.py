"""Pub/sub tools: ``mesh_publish`` and ``mesh_watch``.

Invariants:
- neither reports success for what the station did not do: both compare the connection's
  refusal counters before and after sending (``tools.groups.realm_access.acting``), so a PUBLISH or
  SUBSCRIBE the station dropped (a protected realm: ``realm_refused``; a quota, a rate) is the
  tool's error with a ``next_action``; a watch that was refused returns at once;
- in a realm other than the all-zero one the result gains ``realm_member`` 0/1 (and a hint
  without a membership), as the room tools' do.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from mcp.server.mcpserver import Context, MCPServer
from mcp_types import CallToolResult
from pydantic import Field

from tools.groups.realm_access import (
    PUBLISH_REFUSALS,
    SUBSCRIBE_REFUSALS,
    acting,
    check,
    subscribe_anew,
)
from tools.groups.realms import parse_realm
from tools.groups.text_limits import MAX_TOPIC, IdempotencyKey, Realm
from tools.groups.value_limits import too_deep
from tools.server.context import Descriptions, hints, register_tools, runtime_of
from tools.server.results import bad_argument
from tools.server.runtime import run_tool

MAX_WAIT_S = 3600.0
DEFAULT_WAIT_S = 30.0
MAX_EVENTS = 500


async def mesh_publish(
    ctx: Context,
    topic: Annotated[
        str, Field(max_length=MAX_TOPIC, description="e.g. org.example.news.published_v1")
    ],
    fact: Annotated[Any, Field(description="any JSON value (no booleans)")],
    realm: Realm = None,
    idempotency_key: IdempotencyKey = None,
) -> CallToolResult:
    runtime = runtime_of(ctx)
    tag = parse_realm(realm)
    if isinstance(tag, CallToolResult):
        return tag
    if not topic:  # its length bound: the signature's
        return bad_argument("topic", f"must be 1-{MAX_TOPIC} characters")
    if deep := too_deep("fact", fact):
        return deep

    async def work() -> dict[str, Any]:
        before = await acting(runtime, tag, PUBLISH_REFUSALS)
        seq = await runtime.node.publish(tag, topic, fact)
        in_realm = await check(runtime, before)  # the station dropped it: an error
        return {"topic": topic, "realm": tag.hex(), "seq": seq, "published": 1} | in_realm

    args = {"topic": topic, "fact": fact, "realm": tag.hex()}
    return await run_tool(runtime, "mesh_publish", args, work, idempotency_key=idempotency_key)


async def mesh_watch(
    ctx: Context,
    topic: Annotated[str, Field(max_length=MAX_TOPIC)],  # longer is never published
    duration_seconds: Annotated[float, Field(gt=0, le=MAX_WAIT_S)] = DEFAULT_WAIT_S,
    count: Annotated[int, Field(ge=1, le=MAX_EVENTS)] = 10,
    realm: Realm = None,
) -> CallToolResult:
    runtime = runtime_of(ctx)
    tag = parse_realm(realm)
    if isinstance(tag, CallToolResult):
        return tag

    async def work() -> dict[str, Any]:
        events: list[dict[str, Any]] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + duration_seconds
        before = await acting(runtime, tag, SUBSCRIBE_REFUSALS)
        sub = await runtime.node.subscribe(tag, topic)
        async with sub:
            await subscribe_anew(runtime, tag, topic)  # told now, even if held already
            in_realm = await check(runtime, before)  # refused: no wait for nothing
            while len(events) < count:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                try:
                    delivery = await sub.next(remaining)
                except TimeoutError:
                    break
                events.append(
                    {
                        "publisher": delivery.publisher.hex(),
                        "seq": delivery.seq,
                        "payload": delivery.payload,
                        "authenticated": int(delivery.authenticated),
                        "attested_by": _hex_or_none(delivery.attested_by),
                    }
                )
        return {
            "topic": topic,
            "realm": tag.hex(),
            "events": events,
            "count": len(events),
            "timed_out": int(len(events) < count),
            "missed": sub.missed,
            "gaps": sub.gaps,
            **in_realm,
        }

    return await run_tool(runtime, "mesh_watch", {"topic": topic}, work)


# every tool of this group, in tools/list order, with its hints
TOOLS = (
    (mesh_publish, hints(read_only=False, destructive=False, idempotent=False)),
    (mesh_watch, hints(read_only=True, destructive=False, idempotent=True)),
)


def register(app: MCPServer, describe: Descriptions) -> None:
    register_tools(app, describe, TOOLS)


def _hex_or_none(node_id: bytes | None) -> str | None:
    return None if node_id is None else node_id.hex()
