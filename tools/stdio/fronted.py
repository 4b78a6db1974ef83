"""The plain ``macula-mcp`` behind its stdio front (``tools.stdio.front``): the SDK server
reads the lines the front hands on and writes through it, which drops the replies the front
gave already and learns the handshake card from the others. Lines nested too deep for the
SDK's parser are answered by ``tools.stdio.guard`` on the way in."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, cast

from tools.stdio.front import Front


class _FrontLines:
    """The harness's lines, as the SDK's stdio transport reads a file."""

    def __init__(self, queue: asyncio.Queue[bytes | None]) -> None:
        self.queue = queue

    def __aiter__(self) -> _FrontLines:
        return self

    async def __anext__(self) -> str:
        line = await self.queue.get()
        if line is None:
            raise StopAsyncIteration
        return line.decode("utf-8", "replace")


class _FrontSink:
    def __init__(self, front: Front) -> None:
        self.front = front

    async def write(self, text: str) -> None:
        line = self.front.from_backend(text.encode())
        if line is not None:
            await asyncio.to_thread(self.front.write, line)  # a slow reader never stalls the loop

    async def flush(self) -> None:
        return None


async def serve_behind(app: Any, front: Front) -> None:
    """Serve ``app`` (an ``MCPServer``) on the front's lines until the harness closes stdin."""
    from tools.stdio.guard import serve_guarded  # imports the SDK: only once the front runs

    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[bytes | None] = asyncio.Queue()

    def deliver(line: bytes | None) -> None:  # called on the front's thread
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody reads any more
            loop.call_soon_threadsafe(queue.put_nowait, line)

    front.connect(deliver)
    await serve_guarded(app, _FrontLines(queue), cast(Any, _FrontSink(front)))


def serve_problem(front: Front, env: dict[str, str], code: str, detail: str, fix: str) -> None:
    """Serve MCP on the front's lines with no runtime: every tool answers this problem (attach
    could not reach or use its daemon), until the harness closes stdin. Imports the SDK."""
    from macula.quic.event_loop import run as run_loop
    from tools.server.runtime_gate import Problem, configuration_problem
    from tools.server.server import build_server

    problem = Problem(code, detail, fix, retryable=1)
    if code == "configuration":
        from macula.errors import ConfigError

        problem = configuration_problem(ConfigError(detail))
    run_loop(serve_behind(build_server(env, problem=problem, only_problem=True), front))
