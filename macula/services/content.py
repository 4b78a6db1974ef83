"""Content by id at the station (PROTOCOL.md §11), on one dedicated stream per transfer.

Invariants:
- at most ``CONTENT_WINDOW`` block CALLs are in flight on a content stream (the station answers
  each by ``call_id``, §1.3); the manifest follows the last block;
- every fetched byte is verified (block digests, size, Merkle root) before it is returned.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from macula.errors import MeshError
from macula.node.session import Session
from macula.wire import content
from macula.wire.codes import ErrorCode

CONTENT_BLOCK_TIMEOUT = 15.0
CONTENT_MANIFEST_TIMEOUT = 5.0
# Block CALLs in flight on one content stream. 4, 8 and 16 moved nothing once the I/O was batched
# (docs/performance.md §12: a transfer is CPU-bound at the station, not latency-bound).
CONTENT_WINDOW = 2

T = TypeVar("T")


async def _windowed(work: list[Coroutine[Any, Any, T]], window: int = CONTENT_WINDOW) -> list[T]:
    """Run ``work`` with at most ``window`` in flight; results in order; first error wins."""
    gate = asyncio.Semaphore(window)

    async def one(item: Coroutine[Any, Any, T]) -> T:
        async with gate:
            return await item

    async with asyncio.TaskGroup() as group:
        tasks = [group.create_task(one(item)) for item in work]
    return [task.result() for task in tasks]


class ContentClient:
    """Put and get content through the live session that ``session(timeout)`` returns."""

    def __init__(self, session: Callable[[float], Awaitable[Session]]) -> None:
        self._session = session

    async def put(self, data: bytes, *, name: str = "unnamed") -> bytes:
        """Store ``data`` at the station by content id; returns the 34-byte MCID."""
        plan = content.plan_put(data, name, created=int(time.time()))
        session = await self._session(CONTENT_BLOCK_TIMEOUT)
        async with session.content_stream() as stream:

            async def put(mcid: content.Mcid, block: memoryview) -> None:
                args = {"mcid": mcid.to_bytes(), "payload": bytes(block)}
                answer = await session.builtin(
                    "_content.put_block", args, CONTENT_BLOCK_TIMEOUT, stream=stream
                )
                if answer != "ok":
                    raise MeshError(ErrorCode.UNKNOWN_ERROR, f"put_block answered {answer!r}")

            await _windowed([put(mcid, block) for mcid, block in plan.blocks])
            if plan.manifest is not None:
                answer = await session.builtin(
                    "_content.put_manifest",
                    {"manifest": plan.manifest.to_wire()},
                    CONTENT_MANIFEST_TIMEOUT,
                    stream=stream,
                )
                if answer != "ok":
                    raise MeshError(ErrorCode.UNKNOWN_ERROR, f"put_manifest answered {answer!r}")
        return plan.mcid.to_bytes()

    async def get(self, mcid: bytes) -> bytes:
        """Fetch by MCID and verify every byte (block digests, size, Merkle root)."""
        wanted = content.Mcid.from_bytes(mcid)
        session = await self._session(CONTENT_BLOCK_TIMEOUT)
        async with session.content_stream() as stream:
            if not wanted.is_manifest:
                block = await _get_block(session, stream, wanted)
                content.verify_block(wanted, block)
                return block
            answer = await session.builtin(
                "_content.get_manifest", {"mcid": mcid}, CONTENT_MANIFEST_TIMEOUT, stream=stream
            )
            if answer == "not_found":
                raise MeshError(ErrorCode.UNKNOWN_ERROR, "not_found: no such manifest here")
            manifest = content.Manifest.from_wire(answer)
            manifest.verify(wanted)
            blocks = await _windowed(
                [_get_block(session, stream, info.mcid) for info in manifest.chunks]
            )
            return content.assemble(manifest, blocks)


async def _get_block(session: Session, stream: int, mcid: content.Mcid) -> bytes:
    answer = await session.builtin(
        "_content.get_block", {"mcid": mcid.to_bytes()}, CONTENT_BLOCK_TIMEOUT, stream=stream
    )
    if answer == "not_found" or type(answer) is not bytes:
        raise MeshError(ErrorCode.UNKNOWN_ERROR, f"not_found: block {mcid.hex()[:20]}…")
    return answer
