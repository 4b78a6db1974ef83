"""Finding things again: the station's shared memory (``mesh_remember``, ``mesh_recall``,
``mesh_remember_directory``), the station directory (``mesh_list_stations``) and this agent's
own records (``mesh_search``, issue 40; docs/search.md).

``mesh_search`` invariants:
- Local only (``mesh=False``: no hello, no station): rooms' and the lobby's transcripts, the
  inbox (their unread part) and tasks, as ``macula.agent.search`` reads them.
- The query is words; a query with none, one paging past ``MAX_OFFSET`` or one the index
  cannot answer is a structured error (``code``, ``detail``, ``retryable``, ``next_action``)
  with no SQLite text in it.
- A page follows docs/paging.md: ``remaining`` and ``next_page`` (this call with ``cursor``
  ``o<offset>``), cut between hits by ``PageBudget``; ``matched`` counts every hit, and pages
  reach the first ``MAX_OFFSET`` of them (a broader query is narrowed, not paged through).
"""

from __future__ import annotations

import asyncio
import re
from typing import Annotated, Any, cast

from mcp.server.mcpserver import Context, MCPServer
from mcp_types import CallToolResult
from pydantic import Field

from macula.agent.search import MAX_OFFSET, SOURCES, SearchError, SearchRequest, Source, search
from macula.errors import MaculaError
from macula.services.limits import DEFAULT_TOP_K, MAX_TOP_K
from tools.groups.agent_arguments import invalid, resolve_peers, room_problems, run_agent_tool
from tools.groups.directory_reader import ReadLimits, read_directory, resolve_root
from tools.groups.paging import PageBudget, paged, size
from tools.groups.text_limits import (
    MAX_MEMORY_BYTES,
    MAX_PATH,
    PEER_CHARS,
    ROOM_TOPIC_CHARS,
    STATION_LABEL_CHARS,
    STATION_PLACE_CHARS,
    STATION_QUERY_BYTES,
    Cursor,
    IdempotencyKey,
)
from tools.server.context import Descriptions, hints, register_tools, runtime_of
from tools.server.results import InvalidArgument, bad_argument, fail
from tools.server.runtime import run_tool

MAX_CONTENT_BYTES = MAX_MEMORY_BYTES
LIMITS = ReadLimits()
PLACE = STATION_PLACE_CHARS
DEFAULT_EXTENSIONS = (".md", ".mdx", ".txt")
DEFAULT_EXCLUDES = (".git", "node_modules", ".venv", "__pycache__", "dist", "build")
SHARED = (
    "Memory is SHARED, not private: every agent on this station can recall it (per station: other "
    "stations of the mesh keep their own). Never store secrets."
)


async def mesh_remember(
    ctx: Context,
    content: Annotated[str, Field(max_length=MAX_CONTENT_BYTES, description="<= 256 KiB")],
    source_label: Annotated[str | None, Field(max_length=STATION_LABEL_CHARS)] = None,
    topics: list[str] | None = None,
    idempotency_key: IdempotencyKey = None,
) -> CallToolResult:
    runtime = runtime_of(ctx)
    # counted in bytes, not only in the characters the signature bounds
    if not content.strip() or len(content.encode()) > MAX_CONTENT_BYTES:
        return bad_argument(
            "content", f"must be non-empty text of at most {MAX_CONTENT_BYTES} bytes"
        )

    async def work() -> dict[str, Any]:
        result = await runtime.agent.house.remember(
            content, source_label=source_label, topics=topics
        )
        return {
            "realm": result["realm"],
            "source_label": source_label,
            "chunks": result.get("chunks", 0),
            "document_id": result.get("document_id"),
        }

    args = {"content": content, "source_label": source_label, "topics": topics}
    return await run_tool(runtime, "mesh_remember", args, work, idempotency_key=idempotency_key)


async def mesh_recall(
    ctx: Context,
    query_text: Annotated[str, Field(max_length=STATION_QUERY_BYTES)],
    top_k: Annotated[int, Field(ge=1, le=MAX_TOP_K)] = DEFAULT_TOP_K,
) -> CallToolResult:
    runtime = runtime_of(ctx)
    if not query_text.strip():
        return bad_argument("query_text", "must not be empty")

    async def work() -> dict[str, Any]:
        return await runtime.agent.house.recall(query_text, top_k)

    return await run_tool(runtime, "mesh_recall", {"query_text": query_text, "top_k": top_k}, work)


async def mesh_remember_directory(
    ctx: Context,
    directory: Annotated[str, Field(max_length=MAX_PATH)],
    include_extensions: Annotated[
        list[str] | None, Field(description="default .md/.mdx/.txt")
    ] = None,
    exclude_dirs: list[str] | None = None,
    source_prefix: Annotated[str | None, Field(max_length=STATION_LABEL_CHARS)] = None,
    idempotency_key: IdempotencyKey = None,
) -> CallToolResult:
    runtime = runtime_of(ctx)
    try:
        root = resolve_root(directory)
    except InvalidArgument as exc:
        return bad_argument("directory", str(exc).removeprefix("directory: "))
    extensions = tuple(
        e.lower() if e.startswith(".") else f".{e.lower()}"
        for e in include_extensions or DEFAULT_EXTENSIONS
    )
    excluded = set(exclude_dirs or DEFAULT_EXCLUDES)

    async def work() -> dict[str, Any]:
        # off the event loop: the server answers other calls while the tree is read
        read = await asyncio.to_thread(read_directory, root, extensions, excluded, LIMITS)
        ingested, total_chunks = 0, 0
        failed: list[dict[str, str]] = []
        for index, file in enumerate(read.files):
            await ctx.report_progress(index, len(read.files), file.relative)
            label = f"{source_prefix or ''}{file.relative}"
            try:
                result = await runtime.agent.house.remember(
                    file.text, source_label=label, document_id=file.relative
                )
            except MaculaError as exc:
                failed.append({"path": file.relative, "error": str(exc)})
                continue
            ingested += 1
            total_chunks += int(result.get("chunks", 0))
        await ctx.report_progress(len(read.files), len(read.files), "done")
        return {
            "directory": str(root),
            "ingested_count": ingested,
            "skipped_count": sum(read.skipped.values()),
            "skipped_by_reason": dict(sorted(read.skipped.items())),
            "skipped_sample": read.samples,
            "stopped_early": read.stopped,
            "failed_count": len(failed),
            "total_chunks": total_chunks,
            "failed": failed,
        }

    args = {"directory": str(root), "include": list(extensions), "exclude": sorted(excluded)}
    return await run_tool(
        runtime, "mesh_remember_directory", args, work, idempotency_key=idempotency_key
    )


async def mesh_list_stations(
    ctx: Context,
    near: Annotated[dict[str, float] | None, Field(description="{lat, lng, limit?}")] = None,
    continent: Annotated[str | None, Field(max_length=PLACE, description="e.g. Europe")] = None,
    country: Annotated[str | None, Field(max_length=PLACE, description="e.g. BE")] = None,
    city: Annotated[str | None, Field(max_length=PLACE, description="e.g. Brussels")] = None,
) -> CallToolResult:
    runtime = runtime_of(ctx)
    filters: dict[str, Any] = {
        k: v
        for k, v in (
            ("near", near),
            ("continent", continent),
            ("country", country),
            ("city", city),
        )
        if v
    }
    if near is not None and not {"lat", "lng"} <= set(near):
        return bad_argument("near", "needs lat and lng")

    async def work() -> dict[str, Any]:
        return await runtime.agent.house.list_stations(filters)

    return await run_tool(runtime, "mesh_list_stations", filters, work)


QUERY_CHARS = 500
MAX_HITS = 50
DEFAULT_HITS = 10
MAX_MS = 2**53  # JSON's exact integers
_SEARCH_CURSOR = re.compile(r"o(\d{1,9})\Z")
_RETRY = {"search_failed": 1}
_NEXT = {
    "no_words": "call again with words to find (letters or digits)",
    "too_deep": "narrow the query: more words, room_topic, sender, since_ms or until_ms",
    "search_failed": "retry once; if it fails again, search with other words",
}


async def mesh_search(
    ctx: Context,
    query: Annotated[str, Field(max_length=QUERY_CHARS, description="words, all required")],
    source: Annotated[
        str | None, Field(max_length=5, description="rooms, lobby, inbox or tasks")
    ] = None,
    room_topic: Annotated[str | None, Field(max_length=ROOM_TOPIC_CHARS)] = None,
    sender: Annotated[
        str | None, Field(max_length=PEER_CHARS, description="petname or node id")
    ] = None,
    since_ms: Annotated[int | None, Field(ge=0, le=MAX_MS)] = None,
    until_ms: Annotated[int | None, Field(ge=0, le=MAX_MS)] = None,
    limit: Annotated[int, Field(ge=1, le=MAX_HITS)] = DEFAULT_HITS,
    cursor: Cursor = None,
) -> CallToolResult:
    runtime = runtime_of(ctx)
    problems: list[str] = []
    if room_topic is not None:
        problems += room_problems("room_topic", room_topic, central_ok=True)
    found = _SEARCH_CURSOR.match(cursor) if cursor is not None else None
    if cursor is not None and found is None:
        problems.append("cursor: not one this tool handed out; pass the one from next_page")
    if source is not None and source not in SOURCES:
        problems.append(f"source: one of {', '.join(SOURCES)} (omit: all but inbox)")
    if room_topic is not None and source == "tasks":
        problems.append("room_topic: tasks have no room; omit one of source and room_topic")
    if problems:
        return invalid(problems)
    offset = int(found.group(1)) if found else 0
    refused: list[SearchError] = []
    args = {
        "query": query,
        "source": source,
        "room_topic": room_topic,
        "sender": sender,
        "since_ms": since_ms,
        "until_ms": until_ms,
        "limit": limit,
    }

    async def work() -> dict[str, Any]:
        agent = runtime.agent
        peer = (await resolve_peers(runtime, "sender", [sender]))[0] if sender else None
        kind = cast(Source | None, source)  # checked above
        request = SearchRequest(query, kind, room_topic, peer, since_ms, until_ms, limit, offset)
        try:
            page = await search(agent.rooms.transcript, agent.tasks.store, agent.tasks.me, request)
        except SearchError as exc:
            refused.append(exc)
            return {}
        kept = PageBudget().fit(size(hit) for hit in page.hits)
        hits = page.hits[:kept]
        # pages reach MAX_OFFSET hits deep at most: past that, narrow the query
        remaining = max(min(page.total - kept, MAX_OFFSET - offset - kept), 0)
        return {
            "hits": hits,
            "count": len(hits),
            "matched": offset + page.total,
            "order": "newest" if page.newest else "rank",
            "terms": page.terms,
        } | paged(remaining, "mesh_search", args | {"cursor": f"o{offset + kept}"})

    result = await run_agent_tool(runtime, "mesh_search", args | {"cursor": cursor}, work)
    if refused:
        error = refused[0]
        return fail(
            error.code,
            error.detail,
            retryable=_RETRY.get(error.code, 0),
            next_action=_NEXT.get(error.code, "change the query"),
        )
    return result


# every tool of this group, in tools/list order, with its hints
TOOLS = (
    (mesh_remember, hints(read_only=False, destructive=False, idempotent=False)),
    (mesh_recall, hints(read_only=True, destructive=False, idempotent=True)),
    (mesh_remember_directory, hints(read_only=False, destructive=False, idempotent=True)),
    (mesh_list_stations, hints(read_only=True, destructive=False, idempotent=True)),
    (mesh_search, hints(read_only=True, destructive=False, idempotent=True)),
)


def register(app: MCPServer, describe: Descriptions) -> None:
    register_tools(app, describe, TOOLS)
