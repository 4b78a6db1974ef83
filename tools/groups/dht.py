"""DHT tools: ``mesh_find_record``, ``mesh_find_records``, ``mesh_find_records_by_type``.

Invariants:
- only records whose signature verified against their ``key`` and that have not expired are
  returned (``macula.services.dht.DhtClient`` drops the rest); what this call dropped is reported as
  ``dropped`` {bad_signature, expired, malformed}, the growth of ``node.dht.stats`` across the
  call (a concurrent lookup by the same node can add to it);
- the DHT is read in its own all-zero realm: none of these tools takes a realm;
- a record is rendered as JSON: bytes as lowercase hex (payload included), ``type`` and
  ``type_name``, ``created_at``/``expires_at`` in Unix ms, ``signer`` (the key it verified
  against) and ``key_hex``, the storage key to look it up again with ``mesh_find_record``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from mcp.server.mcpserver import Context, MCPServer
from mcp_types import CallToolResult
from pydantic import Field

from macula.wire.errors import WireError
from macula.wire.record_keys import KEY_SIZE, is_domain_type
from macula.wire.records import Record, RecordType, has_storage_rule
from tools.groups.realms import parse_hex
from tools.groups.text_limits import RECORD_TYPE_CHARS, KeyHex
from tools.server.context import Descriptions, hints, register_tools, runtime_of
from tools.server.results import bad_argument, plain
from tools.server.runtime import Runtime, run_tool

DROP_REASONS = ("bad_signature", "expired", "malformed")
TYPE_NAMES = {t.name.lower(): int(t) for t in RecordType}


def type_name(record_type: int) -> str:
    if record_type in TYPE_NAMES.values():
        return RecordType(record_type).name.lower()
    return f"domain_0x{record_type:02x}" if is_domain_type(record_type) else f"0x{record_type:02x}"


def render(record: Record) -> dict[str, Any]:
    view: dict[str, Any] = {
        "type": record.type,
        "type_name": type_name(record.type),
        "signer": record.key.hex(),
        "version": record.version.hex(),
        "created_at": record.created_at,
        "expires_at": record.expires_at,
        "payload": plain(record.payload),
    }
    if record.subject_id is not None:
        view["subject_id"] = record.subject_id.hex()
    try:
        view["key_hex"] = record.storage_key().hex()
    except WireError:  # a type whose storage key needs inputs the record does not carry
        view["key_hex"] = None
    return view


def parse_record_type(value: str | int) -> int | CallToolResult:
    """A name (``procedure_advertisement``), or a number 1-255 (``6``, ``"0x06"``)."""
    names = ", ".join(TYPE_NAMES)
    if isinstance(value, str):
        text = value.strip().lower()
        if text in TYPE_NAMES:
            return TYPE_NAMES[text]
        try:
            value = int(text, 0)
        except ValueError:
            return bad_argument("record_type", f"unknown name {value!r}; names: {names}; or 1-255")
    if isinstance(value, bool) or not 1 <= value <= 255:
        return bad_argument("record_type", "a number must be 1-255")
    if not has_storage_rule(value):
        return bad_argument("record_type", f"0x{value:02x} is retired or unassigned; use one of "
                            f"{names}, or a domain type 0x20-0xff")  # fmt: skip
    return value


async def counting_drops(
    runtime: Runtime, lookup: Callable[[], Awaitable[list[Record]]]
) -> tuple[list[Record], dict[str, int]]:
    stats = runtime.node.dht.stats
    before = {reason: stats[reason] for reason in DROP_REASONS}
    records = await lookup()
    return records, {reason: stats[reason] - before[reason] for reason in DROP_REASONS}


KEY_HELP = "64 hex, e.g. SHA-256 of a procedure name"


async def mesh_find_record(
    ctx: Context, key_hex: Annotated[KeyHex, Field(description=KEY_HELP)]
) -> CallToolResult:
    runtime = runtime_of(ctx)
    key = parse_hex("key_hex", key_hex, KEY_SIZE)
    if isinstance(key, CallToolResult):
        return key

    async def work() -> dict[str, Any]:
        records, dropped = await counting_drops(runtime, lambda: runtime.node.dht.find_records(key))
        record = render(records[0]) if records else None
        return {"key_hex": key.hex(), "record": record, "dropped": dropped}

    return await run_tool(runtime, "mesh_find_record", {"key_hex": key.hex()}, work)


async def mesh_find_records(
    ctx: Context, key_hex: Annotated[KeyHex, Field(description=KEY_HELP)]
) -> CallToolResult:
    runtime = runtime_of(ctx)
    key = parse_hex("key_hex", key_hex, KEY_SIZE)
    if isinstance(key, CallToolResult):
        return key

    async def work() -> dict[str, Any]:
        records, dropped = await counting_drops(runtime, lambda: runtime.node.dht.find_records(key))
        return {"key_hex": key.hex(), "records": [render(r) for r in records],
                "count": len(records), "dropped": dropped}  # fmt: skip

    return await run_tool(runtime, "mesh_find_records", {"key_hex": key.hex()}, work)


async def mesh_find_records_by_type(
    ctx: Context,
    record_type: Annotated[str, Field(max_length=RECORD_TYPE_CHARS)]
    | Annotated[int, Field(ge=1, le=255)],
) -> CallToolResult:
    runtime = runtime_of(ctx)
    number = parse_record_type(record_type)
    if isinstance(number, CallToolResult):
        return number

    async def work() -> dict[str, Any]:
        records, dropped = await counting_drops(
            runtime, lambda: runtime.node.dht.find_records_by_type(number)
        )
        return {"record_type": number, "record_type_name": type_name(number),
                "records": [render(r) for r in records], "count": len(records),
                "dropped": dropped}  # fmt: skip

    return await run_tool(runtime, "mesh_find_records_by_type", {"record_type": number}, work)


# every tool of this group, in tools/list order, with its hints
TOOLS = (
    (mesh_find_record, hints(read_only=True, destructive=False, idempotent=True)),
    (mesh_find_records, hints(read_only=True, destructive=False, idempotent=True)),
    (mesh_find_records_by_type, hints(read_only=True, destructive=False, idempotent=True)),
)


def register(app: MCPServer, describe: Descriptions) -> None:
    register_tools(app, describe, TOOLS)
