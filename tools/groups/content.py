"""Content tools: ``mesh_put`` and ``mesh_get`` (content-addressed artifacts, PROTOCOL.md §11).

Invariants:
- ``content`` is strict base64 (``validate=True``: no whitespace, no URL-safe alphabet, correct
  padding); at most ``MAX_PUT_BYTES`` decoded;
- ``mesh_get`` returns bytes only after the library verified every one of them against the MCID
  (block digests, manifest MCID, Merkle root); a mismatch is ``content_invalid``, never data;
- a tool result is bounded (about 24 KB of JSON, ``tools.server.results``) and base64 must never be
  cut, so ``mesh_get`` answers inline only up to ``MAX_INLINE_BYTES`` (12 KiB, 16 KiB of
  base64) and refuses larger artifacts with ``too_large`` and their size. For a manifest MCID
  the size is read from the verified manifest first, so no block is fetched just to refuse.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from typing import Annotated, Any

from mcp.server.mcpserver import Context, MCPServer
from mcp_types import CallToolResult
from pydantic import Field

from macula.errors import MeshError
from macula.node.node import Node
from macula.wire.codes import ErrorCode
from macula.wire.content import MCID_SIZE, Manifest, Mcid
from macula.wire.errors import ProtocolError
from macula.wire.identity import ZERO_REALM
from tools.groups.realms import parse_hex
from tools.groups.text_limits import (
    MAX_CONTENT_NAME,
    MAX_PUT_BASE64,
    IdempotencyKey,
    McidHex,
)
from tools.server.context import Descriptions, hints, register_tools, runtime_of
from tools.server.results import bad_argument
from tools.server.runtime import run_tool

MAX_INLINE_BYTES = 12 * 1024
MAX_NAME = MAX_CONTENT_NAME
MANIFEST_TIMEOUT_S = 5.0


def refusal(name: str, code: ErrorCode, detail: str) -> MeshError:
    """A named failure for ``from_error`` (its ``code`` is ``name``), never retryable."""
    error = MeshError(code, detail, name=name)
    error.retryable = False
    return error


def not_found(mcid: Mcid) -> MeshError:
    detail = (
        f"the station has no artifact {mcid.hex()}: check the MCID; artifacts live at the "
        "station they were put to (cross-station copies are best-effort)"
    )
    return refusal("not_found", ErrorCode.UNKNOWN_ERROR, detail)


def too_large(size: int) -> MeshError:
    return refusal("too_large", ErrorCode.PAYLOAD_TOO_LARGE,
                   f"the artifact is {size} bytes; mesh_get returns at most {MAX_INLINE_BYTES} "
                   "bytes inline (a larger result would be truncated): share smaller artifacts, "
                   "e.g. split it into parts of at most that size")  # fmt: skip


def invalid(exc: ProtocolError) -> MeshError:
    return refusal("content_invalid", ErrorCode.SIGNATURE_INVALID,
                   f"the station's bytes do not match the MCID ({exc.reason}: {exc.detail}); "
                   "nothing was returned: do not trust that station's copy")  # fmt: skip


async def verified_manifest(node: Node, mcid: Mcid) -> Manifest:
    """The manifest of ``mcid``, checked against it (so its ``size`` can be trusted)."""
    answer = await node.call(
        ZERO_REALM, "_content.get_manifest", {"mcid": mcid.to_bytes()}, timeout=MANIFEST_TIMEOUT_S
    )
    if answer == "not_found":
        raise not_found(mcid)
    try:
        manifest = Manifest.from_wire(answer)
        manifest.verify(mcid)
    except ProtocolError as exc:
        raise invalid(exc) from None
    return manifest


async def fetch_small(node: Node, mcid: Mcid) -> tuple[bytes, str | None]:
    """The verified bytes of ``mcid`` and its manifest name, or ``too_large`` beyond the limit."""
    name = None
    if mcid.is_manifest:
        manifest = await verified_manifest(node, mcid)
        if manifest.size > MAX_INLINE_BYTES:
            raise too_large(manifest.size)
        name = manifest.name
    try:
        data = await node.get_content(mcid.to_bytes())
    except ProtocolError as exc:
        raise invalid(exc) from None
    except MeshError as exc:
        if (exc.detail or "").startswith("not_found"):
            raise not_found(mcid) from None
        raise
    if len(data) > MAX_INLINE_BYTES:
        raise too_large(len(data))
    return data, name


async def mesh_put(
    ctx: Context,
    content: Annotated[str, Field(max_length=MAX_PUT_BASE64, description="strict base64")],
    name: Annotated[str, Field(max_length=MAX_NAME)] = "unnamed",
    idempotency_key: IdempotencyKey = None,
) -> CallToolResult:
    runtime = runtime_of(ctx)
    try:
        data = base64.b64decode(content, validate=True)
    except (binascii.Error, ValueError):
        return bad_argument("content", "is not strict base64 (standard alphabet, padding, "
                            "no whitespace or line breaks)")  # fmt: skip
    if not name or not name.isprintable():  # its length bound: the signature's
        return bad_argument("name", f"must be 1-{MAX_NAME} printable characters")

    async def work() -> dict[str, Any]:
        mcid = await runtime.node.put_content(data, name=name)
        return {"mcid_hex": mcid.hex(), "size_bytes": len(data), "name": name}

    request = {"content_sha256": hashlib.sha256(data).hexdigest(), "name": name}
    return await run_tool(runtime, "mesh_put", request, work, idempotency_key=idempotency_key)


async def mesh_get(
    ctx: Context,
    mcid_hex: McidHex,
) -> CallToolResult:
    runtime = runtime_of(ctx)
    raw = parse_hex("mcid_hex", mcid_hex, MCID_SIZE)
    if isinstance(raw, CallToolResult):
        return raw
    try:
        mcid = Mcid.from_bytes(raw)
    except ProtocolError as exc:
        return bad_argument("mcid_hex", exc.detail)

    async def work() -> dict[str, Any]:
        data, name = await fetch_small(runtime.node, mcid)
        encoded = base64.b64encode(data).decode("ascii")
        return {"mcid_hex": mcid.hex(), "size_bytes": len(data),
                "content_base64": encoded, "name": name}  # fmt: skip

    return await run_tool(runtime, "mesh_get", {"mcid_hex": mcid.hex()}, work)


# every tool of this group, in tools/list order, with its hints
TOOLS = (
    (mesh_put, hints(read_only=False, destructive=False, idempotent=True)),
    (mesh_get, hints(read_only=True, destructive=False, idempotent=True)),
)


def register(app: MCPServer, describe: Descriptions) -> None:
    register_tools(app, describe, TOOLS)
