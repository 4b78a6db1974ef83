"""Realms for tools: the shared realm argument (a name or a 64-hex tag), hex ids, and the
tools ``mesh_join_realm`` and ``mesh_list_realms``.

Invariants:
- ``parse_realm`` is the one reading of a ``realm`` argument: absent -> the all-zero realm,
  64 hex characters -> that tag, a realm name (``macula.realm.records.name_problem``) ->
  ``realm_tag(name)``. A 64-hex name is read as a tag.
- A join's code, link and QR code are in the result of the ``mesh_join_realm`` call that
  started it and nowhere else (not in receipts: the tool takes no idempotency key; not in
  ``mesh://identity``, presence or logs). Later calls report only the outcome.
- ``mesh_list_realms`` and ``mesh://identity`` show confirmed memberships only: name, tag,
  authority, role, joined_at, valid_until; never a pending join, never a record or signature.
"""

from __future__ import annotations

import base64
import io
import weakref
from typing import Annotated, Any

import segno
from mcp.server.mcpserver import Context, MCPServer
from mcp_types import CallToolResult, ImageContent
from pydantic import Field

from macula.config import macula_home
from macula.node.node import Node
from macula.realm.joiner import JoinError, RealmJoiner, Ticket
from macula.realm.membership import MembershipStore, memberships_path
from macula.realm.records import MAX_NAME, name_problem
from macula.wire.identity import ZERO_REALM, realm_tag
from tools.groups.text_limits import Hex64
from tools.server.context import Descriptions, hints, register_tools, runtime_of
from tools.server.results import bad_argument, fail
from tools.server.runtime import Runtime, run_tool

MAX_JOIN_WAIT_S = 600.0


def parse_realm(realm: str | None) -> bytes | CallToolResult:
    """A realm name or 64 hex characters (any case); None or "" for the all-zero realm."""
    if realm is None or realm == "":
        return ZERO_REALM
    if len(realm) == 64:
        try:
            return bytes.fromhex(realm)
        except ValueError:
            pass
    if name_problem(realm) is None:
        return realm_tag(realm)
    return bad_argument(
        "realm", "must be a realm name (lowercase, digits, '.', '_', '-') or 64 hex characters"
    )


def parse_hex(name: str, value: str, size: int) -> bytes | CallToolResult:
    try:
        raw = bytes.fromhex(value)
    except ValueError:
        return bad_argument(name, f"must be {size * 2} hex characters")
    if len(raw) != size:
        return bad_argument(name, f"must be {size * 2} hex characters ({size} bytes)")
    return raw


def membership_store(runtime: Runtime) -> MembershipStore:
    identity = runtime.node.identity
    return MembershipStore(memberships_path(macula_home(runtime.env), identity.node_id), identity)


_joiners: weakref.WeakKeyDictionary[Node, RealmJoiner] = weakref.WeakKeyDictionary()


def _joiner(runtime: Runtime) -> RealmJoiner:
    node = runtime.node
    joiner = _joiners.get(node)
    if joiner is None:
        joiner = _joiners[node] = RealmJoiner(node, membership_store(runtime), node._spawn_task)
    return joiner


def _ticket_view(ticket: Ticket) -> tuple[dict[str, Any], bytes]:
    qr = segno.make(ticket.link, error="m")
    text = io.StringIO()
    qr.terminal(out=text, compact=True)
    png = io.BytesIO()
    qr.save(png, kind="png", scale=6, border=2)
    view = {
        "realm": ticket.name,
        "status": "pending",
        "code": ticket.code,
        "link": ticket.link,
        "qr_text": text.getvalue(),
        "expires_at": ticket.expires_at,
        "authority": ticket.authority.hex(),
        "next_action": f"show the person this code (or QR); they run: macula-realm --realm "
        f"{ticket.name} approve {ticket.code}. Then call mesh_join_realm again with "
        "wait_seconds to pick up the outcome. The code is shown only this once.",
    }
    return view, png.getvalue()


async def mesh_join_realm(
    ctx: Context,
    realm: Annotated[
        str, Field(max_length=MAX_NAME, description="the realm's name, e.g. org.example.team")
    ],
    wait_seconds: Annotated[float, Field(ge=0, le=MAX_JOIN_WAIT_S)] = 0.0,
    authority: Annotated[
        Hex64 | None, Field(description="64 hex: accept only this authority")
    ] = None,
) -> CallToolResult:
    runtime = runtime_of(ctx)
    if problem := name_problem(realm):  # the library's rule: characters and length
        return bad_argument("realm", problem)
    pinned = None if authority is None else parse_hex("authority", authority, 32)
    if isinstance(pinned, CallToolResult):
        return pinned
    joiner = _joiner(runtime)
    png: list[bytes] = []
    refused: list[JoinError] = []

    async def work() -> dict[str, Any]:
        if joiner.in_progress(realm):
            return await joiner.wait(realm, wait_seconds)
        earlier = joiner.outcome(realm)
        if earlier["status"] != "none" and wait_seconds > 0:
            return earlier  # finished since the call that started it
        try:
            started = await joiner.start(realm, pinned)
        except JoinError as exc:
            refused.append(exc)
            return {}
        if isinstance(started, dict):
            return started
        view, image = _ticket_view(started)
        png.append(image)
        return view

    result = await run_tool(runtime, "mesh_join_realm", {"realm": realm}, work)
    if refused:
        exc = refused[0]
        action = _JOIN_ACTIONS.get(
            exc.reason, "read detail; check the realm name and that its owner runs serve"
        )
        return fail(
            f"join_{exc.reason}",
            exc.detail,
            retryable=exc.retryable,
            next_action="retry in a minute" if exc.retryable else action,
        )
    if png and not result.is_error:
        data = base64.b64encode(png[0]).decode("ascii")
        result.content.append(ImageContent(type="image", data=data, mime_type="image/png"))
    return result


async def mesh_list_realms(ctx: Context) -> CallToolResult:
    runtime = runtime_of(ctx)

    async def work() -> dict[str, Any]:
        views = [m.view() for m in membership_store(runtime).memberships()]
        return {"realms": views, "count": len(views)}

    return await run_tool(runtime, "mesh_list_realms", {}, work, mesh=False)


# every tool of this group, in tools/list order, with its hints
TOOLS = (
    (mesh_join_realm, hints(read_only=False, destructive=False, idempotent=False)),
    (mesh_list_realms, hints(read_only=True, destructive=False, idempotent=True, open_world=False)),
)


def register(app: MCPServer, describe: Descriptions) -> None:
    register_tools(app, describe, TOOLS)


_JOIN_ACTIONS = {
    "in_progress": "call mesh_join_realm again with wait_seconds to wait for the outcome",
    "replayed": "call again (a fresh proof is signed each time)",
    "stale": "check this machine's clock, then call again",
}
