"""Path reservations on the station (docs/reservations.md): an agent claims paths or globs of
a project, exclusively or shared, for a time, so that another agent (and the commit guard,
``macula-mcp guard``) knows who is working where.

Invariants:
- The project is the normalised origin URL of the git repository this server runs in (asked
  of ``git`` off the event loop), unless the call names one (a name, or a URL normalised like
  an origin); ``realm`` scopes it further.
- Paths are relative to the repository's root; an absolute one inside it is made relative, one
  outside it (or ``..``) is refused before anything is sent.
- A conflict is a tool error ``reservation_conflict`` naming each holder (petname and the name
  it gave), the paths, the expiry and the reason; nothing was reserved.
- ``mesh_reservations`` is a page by the one rule (``tools.groups.paging``): ``remaining`` and
  ``next_page``; its cursor is ``r<id>``. Payloads carry 0/1, never booleans.
"""

from __future__ import annotations

import asyncio
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

from mcp.server.mcpserver import Context, MCPServer
from mcp_types import CallToolResult
from pydantic import Field

from macula.agent.petnames import petname
from macula.services.limits import (
    DEFAULT_RESERVATION_TTL_S,
    MAX_PROJECT_CHARS,
    MAX_RESERVATION_PATH_CHARS,
    MAX_RESERVATION_PATHS,
    MAX_RESERVATION_REASON_CHARS,
    MAX_RESERVATION_TTL_S,
    MIN_RESERVATION_TTL_S,
)
from macula.services.reservation_paths import PathRefused, normalise_path, relative_to_root
from tools.groups.paging import PageBudget, paged, size
from tools.groups.text_limits import Cursor, Realm
from tools.guard.project import GitError, project_id, project_of, repo_root
from tools.server.context import Descriptions, hints, register_tools, runtime_of
from tools.server.results import bad_argument, fail
from tools.server.runtime import Runtime, run_tool

_CURSOR = re.compile(r"r(\d{1,18})\Z")
Project = Annotated[
    str | None,
    Field(max_length=MAX_PROJECT_CHARS, description="default: this repo's origin URL"),
]
Paths = Annotated[
    list[Annotated[str, Field(max_length=MAX_RESERVATION_PATH_CHARS)]],
    Field(description=f"1..{MAX_RESERVATION_PATHS}, relative to the repo root"),
]


class _Refused(Exception):
    def __init__(self, name: str, problem: str) -> None:
        super().__init__(problem)
        self.name = name


def _scope(project: str | None) -> tuple[str, Path | None]:
    """The project id, and the repository root when the server runs inside one."""
    try:
        root: Path | None = repo_root(Path.cwd())
    except GitError:
        root = None
    try:
        if project is not None and project.strip():
            return project_id(project), root
        if root is None:
            raise _Refused("project", "this server runs in no git repository: give a project")
        return project_of(root), root
    except (GitError, PathRefused) as exc:
        raise _Refused("project", str(exc)) from None


def _paths(raw: list[str], root: Path | None) -> list[str]:
    if not 1 <= len(raw) <= MAX_RESERVATION_PATHS:
        raise _Refused("paths", f"give 1..{MAX_RESERVATION_PATHS} paths or globs")
    paths = []
    for index, item in enumerate(raw):
        try:
            relative = relative_to_root(item, str(root)) if root is not None else item
            paths.append(normalise_path(relative))
        except PathRefused as exc:
            raise _Refused(f"paths[{index}]", str(exc)) from None
    return paths


def _when(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="seconds")


def _view(row: dict[str, Any]) -> dict[str, Any]:
    holder = str(row.get("holder", ""))
    try:
        name = petname(bytes.fromhex(holder))
    except ValueError:
        name = ""
    view = {
        "holder": holder,
        "holder_petname": name,
        "holder_name": row.get("holder_name", ""),
        "path": row.get("path"),
        "exclusive": int(row.get("exclusive", 0)),
        "reason": row.get("reason", ""),
        "expires_at": _when(int(row.get("expires_ms", 0))),
        "id": row.get("id"),
    }
    if "requested" in row:
        view["requested"] = row["requested"]
    return view


def _conflict(project: str, conflicts: list[dict[str, Any]]) -> CallToolResult:
    views = [_view(c) for c in conflicts]
    said = "; ".join(
        f"{v['holder_petname']} ({v['holder_name'] or v['holder'][:16]}) holds {v['path']}"
        f"{' exclusively' if v['exclusive'] else ''} until {v['expires_at']}"
        f" ({v['reason'] or 'no reason given'})"
        for v in views
    )
    return fail(
        "reservation_conflict",
        f"nothing reserved in {project}: {said}",
        retryable=True,
        next_action="work elsewhere, ask the holder (mesh_ring), reserve shared (exclusive 0),"
        " or retry after the expiry",
        conflicts=views,
    )


def _me(runtime: Runtime) -> str:
    named = runtime.agent.settings.profile.operator_name
    return named or petname(runtime.node.identity.node_id)


async def mesh_reserve_paths(
    ctx: Context,
    paths: Paths,
    exclusive: Annotated[int, Field(ge=0, le=1, description="1 exclusive, 0 shared")] = 1,
    ttl_seconds: Annotated[
        int, Field(ge=MIN_RESERVATION_TTL_S, le=MAX_RESERVATION_TTL_S)
    ] = DEFAULT_RESERVATION_TTL_S,
    reason: Annotated[str, Field(max_length=MAX_RESERVATION_REASON_CHARS)] = "",
    project: Project = None,
    realm: Realm = None,
) -> CallToolResult:
    runtime = runtime_of(ctx)
    try:
        scope, root = await asyncio.to_thread(_scope, project)
        wanted = _paths(paths, root)
    except _Refused as exc:
        return bad_argument(exc.name, str(exc))
    clash: list[dict[str, Any]] = []

    async def work() -> dict[str, Any]:
        result = await runtime.agent.house.reserve_paths(
            scope,
            wanted,
            realm=realm,
            exclusive=exclusive,
            ttl_seconds=ttl_seconds,
            reason=reason,
            holder_name=_me(runtime),
        )
        if not result.get("granted"):
            clash.extend(result.get("conflicts") or [])
            return {}
        expires = int(result.get("expires_ms", 0))
        return {
            "project": scope,
            "granted": 1,
            "paths": result.get("paths", wanted),
            "exclusive": exclusive,
            "expires_at": _when(expires),
        }

    args = {"project": scope, "paths": wanted, "exclusive": exclusive, "ttl": ttl_seconds}
    answered = await run_tool(runtime, "mesh_reserve_paths", args, work)
    return _conflict(scope, clash) if clash else answered


async def mesh_release_paths(
    ctx: Context,
    paths: Annotated[
        list[Annotated[str, Field(max_length=MAX_RESERVATION_PATH_CHARS)]] | None,
        Field(description="default: all of yours"),
    ] = None,
    project: Project = None,
    realm: Realm = None,
) -> CallToolResult:
    runtime = runtime_of(ctx)
    try:
        scope, root = await asyncio.to_thread(_scope, project)
        wanted = None if paths is None else _paths(paths, root)
    except _Refused as exc:
        return bad_argument(exc.name, str(exc))

    async def work() -> dict[str, Any]:
        result = await runtime.agent.house.release_paths(scope, wanted, realm=realm)
        return {"project": scope, "released": int(result.get("released", 0))}

    return await run_tool(runtime, "mesh_release_paths", {"project": scope, "paths": wanted}, work)


async def mesh_reservations(
    ctx: Context,
    touching: Annotated[
        str | None, Field(max_length=MAX_RESERVATION_PATH_CHARS, description="a file path")
    ] = None,
    project: Project = None,
    realm: Realm = None,
    cursor: Cursor = None,
) -> CallToolResult:
    runtime = runtime_of(ctx)
    after = 0
    if cursor is not None:
        found = _CURSOR.match(cursor)
        if found is None:
            return bad_argument("cursor", "must be a next_page cursor of mesh_reservations")
        after = int(found.group(1))
    try:
        scope, root = await asyncio.to_thread(_scope, project)
        where = None
        if touching is not None:
            where = relative_to_root(touching, str(root)) if root is not None else touching
    except (_Refused, PathRefused) as exc:
        return bad_argument(getattr(exc, "name", "touching"), str(exc))

    async def work() -> dict[str, Any]:
        result = await runtime.agent.house.list_reservations(
            scope, realm=realm, after_id=after, touching=where
        )
        rows = [_view(r) for r in result.get("reservations") or []]
        budget = PageBudget()
        kept = rows[: budget.fit(size(r) for r in rows)]
        remaining = int(result.get("remaining", 0)) + len(rows) - len(kept)
        arguments = {"touching": touching, "project": project, "realm": realm}
        if kept:
            arguments["cursor"] = f"r{kept[-1]['id']}"
        return {"project": scope, "reservations": kept} | paged(
            remaining, "mesh_reservations", arguments
        )

    return await run_tool(runtime, "mesh_reservations", {"project": scope}, work)


# every tool of this group, in tools/list order, with its hints
TOOLS = (
    (mesh_reserve_paths, hints(read_only=False, destructive=False, idempotent=True)),
    (mesh_release_paths, hints(read_only=False, destructive=True, idempotent=True)),
    (mesh_reservations, hints(read_only=True, destructive=False, idempotent=True)),
)


def register(app: MCPServer, describe: Descriptions) -> None:
    register_tools(app, describe, TOOLS)
