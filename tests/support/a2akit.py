"""An A2A agent of the SDK's own kind, in the test process: ``a2a-sdk``'s request handler with an
``AgentExecutor``, its Starlette routes (Agent Card + JSON-RPC), served by uvicorn on 127.0.0.1
on a free port; and a TCP listener that only counts the connections made to it.

The executor does what the input says (first word):
- ``echo X``: working, an artifact ``done: X``, completed;
- ``ask``: input-required ("which colour?"); the answer completes it with ``colour: <answer>``;
- ``hold``: working until canceled;
- ``fail`` / ``reject`` / ``auth``: failed ("cannot do it") / rejected / auth-required;
- ``flood``: an artifact of 100 KB, then completed.

Invariants: loopback only; every served app is shut down (uvicorn exits)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import uvicorn
from a2a.helpers.proto_helpers import new_task, new_text_artifact, new_text_message
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    Role,
    SecurityRequirement,
    TaskState,
)
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .waiting import eventually


@dataclass
class Seen:
    inputs: list[str] = field(default_factory=list)
    titles: list[str] = field(default_factory=list)
    canceled: int = 0
    late: asyncio.Event = field(default_factory=asyncio.Event)  # "late ...": first answer after


class Executor(AgentExecutor):
    def __init__(self, seen: Seen) -> None:
        self.seen = seen

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        text = context.get_user_input()
        self.seen.inputs.append(text)
        if context.message is not None and "title" in context.message.metadata:
            self.seen.titles.append(str(context.message.metadata["title"]))
        assert context.task_id is not None and context.context_id is not None
        updater = TaskUpdater(event_queue, context.task_id, context.context_id)
        if context.current_task is not None:  # an answer to our question
            await updater.start_work()
            await updater.add_artifact(new_text_artifact("answer", f"colour: {text}").parts)
            await updater.complete()
            return
        if text.startswith("late "):  # the first answer waits until the test sets ``late``
            await self.seen.late.wait()
            text = text[5:]
        await event_queue.enqueue_event(
            new_task(context.task_id, context.context_id, TaskState.TASK_STATE_SUBMITTED)
        )
        word = text.split(" ", 1)[0]
        if word == "echo":
            await updater.start_work(_say("on it"))
            await updater.add_artifact(new_text_artifact("echo", "done: " + text[5:]).parts)
            await updater.complete()
        elif word == "ask":
            await updater.requires_input(_say("which colour?"))
        elif word == "hold":
            await updater.start_work(_say("holding"))
            await asyncio.Event().wait()  # until canceled
        elif word == "fail":
            await updater.failed(_say("cannot do it"))
        elif word == "reject":
            await updater.reject(_say("not my kind of work"))
        elif word == "auth":
            await updater.requires_auth(_say("log in first"))
        elif word == "flood":
            await updater.add_artifact(new_text_artifact("big", "x" * 100_000).parts)
            await updater.complete()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        self.seen.canceled += 1
        assert context.task_id is not None and context.context_id is not None
        await TaskUpdater(event_queue, context.task_id, context.context_id).cancel()


def _say(text: str) -> object:
    return new_text_message(text, role=Role.ROLE_AGENT)


def agent_card(url: str, *, streaming: bool = True, secured: bool = False) -> AgentCard:
    card = AgentCard(
        name="test helper",
        description="an A2A agent of the SDK's own kind, for tests",
        version="1.0.0",
        capabilities=AgentCapabilities(streaming=streaming),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        supported_interfaces=[
            AgentInterface(url=url, protocol_binding="JSONRPC", protocol_version="1.0")
        ],
        skills=[AgentSkill(id="echo", name="echo", description="echoes", tags=["test"])],
    )
    if secured:
        card.security_requirements.append(SecurityRequirement())
        card.security_requirements[0].schemes["bearer"].list.append("")
    return card


def bound_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


@dataclass
class A2AAgent:
    url: str  # its base URL (the Card under /.well-known/agent-card.json)
    seen: Seen


@asynccontextmanager
async def serve(app: Starlette, sock: socket.socket) -> AsyncIterator[None]:
    config = uvicorn.Config(app, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
    await eventually(lambda: server.started or task.done(), 20.0)
    try:
        yield
    finally:
        server.should_exit = True
        server.force_exit = True  # streams held open by a waiting task end now
        await task
        sock.close()


@asynccontextmanager
async def a2a_agent(*, streaming: bool = True, secured: bool = False) -> AsyncIterator[A2AAgent]:
    """The SDK's own A2A server with ``Executor``, at ``http://127.0.0.1:<port>/``."""
    sock = bound_socket()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/"
    seen = Seen()
    card = agent_card(url, streaming=streaming, secured=secured)
    handler = DefaultRequestHandler(Executor(seen), InMemoryTaskStore(), card)
    routes = create_agent_card_routes(card) + create_jsonrpc_routes(handler, "/")
    async with serve(Starlette(routes=routes), sock):
        yield A2AAgent(url, seen)


@asynccontextmanager
async def broken_agent(answer: bytes) -> AsyncIterator[str]:
    """A valid Card, and ``answer`` (not JSON-RPC) to every request: the malformed agent."""
    sock = bound_socket()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/"
    card = agent_card(url, streaming=False)

    async def rpc(_: Request) -> Response:
        return Response(answer, media_type="application/json")

    routes = [*create_agent_card_routes(card), Route("/", rpc, methods=["POST"])]
    async with serve(Starlette(routes=routes), sock):
        yield url


@dataclass
class Listener:
    url: str
    connections: int = 0


@asynccontextmanager
async def counting_listener() -> AsyncIterator[Listener]:
    """A TCP listener on 127.0.0.1 that counts connections (and closes each at once)."""
    listener = Listener("")

    def accepted(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        listener.connections += 1
        writer.close()

    server = await asyncio.start_server(accepted, "127.0.0.1", 0)
    listener.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/"
    async with server:
        yield listener
