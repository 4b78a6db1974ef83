"""The A2A door: A2A 1.0 (JSON-RPC binding) for each agent the daemon hosts, under
``/a2a/<agent>/`` on the daemon's HTTP listener (``tools.daemon.http.listener``).

``<agent>`` is an agent name (``MACULA_MCP_AGENT``; its key is ``$MACULA_HOME/agents/NAME.key``)
or a hosted agent's node id (64 hex). Under it:
- ``.well-known/agent-card.json`` (GET, no token: it is how a client learns the scheme): the
  signed Agent Card (``tools.a2a.card``);
- ``/`` (POST): the SDK's JSON-RPC routes and ``DefaultRequestHandler`` (send, stream, get, list,
  cancel, subscribe), our ``MeshExecutor``, and the SDK's in-memory ``TaskStore`` scoped by
  owner, the owner being the A2A client the token names (bounded: ``tools.a2a.task_store``).

Invariants:
- only agents this daemon hosts (an open runtime): another is 404, one whose runtime is not open
  is 503 (start a session of it); each door serves its own daemon's agents only;
- every request but the card's needs ``Authorization: Bearer <token>`` of an A2A client
  (``tools.a2a.tokens``): none or unknown is 401 with ``WWW-Authenticate: Bearer``; a token of
  another agent is 403; so a client reaches one agent, and only its own tasks there (the store
  is scoped by the client's node id, never its name: another's task is ``TaskNotFoundError``);
- a body is at most ``MAX_BODY`` bytes (413, said as JSON-RPC -32600), with or without
  Content-Length: the door reads it whole, then hands it to the SDK; the message itself is
  checked against the mesh task bounds before anything runs (``DoorHandler``, ``tools.a2a.parts``);
- the token is never logged nor echoed: the ``Authorization`` header is taken out of the request
  before the SDK sees it (its call context keeps the headers, and its debug log prints them).
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import re
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from a2a.server.context import ServerCallContext
from a2a.server.events import Event
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.types import AgentCard, Message, SendMessageRequest, Task
from a2a.utils.constants import AGENT_CARD_WELL_KNOWN_PATH
from starlette.applications import Starlette
from starlette.authentication import AuthCredentials, SimpleUser
from starlette.types import Receive, Scope, Send

from macula.agent.task_messages import TaskLimits
from macula.agent.tasks import Tasks
from macula.config import AGENT_ENV, known_stations_from_env
from macula.errors import ConfigError, MaculaError
from macula.keyfile import load_identity
from tools.a2a import tokens
from tools.a2a.card import agent_card, sign_card
from tools.a2a.executor import MeshExecutor
from tools.a2a.parts import message_value
from tools.a2a.requesters import Requesters
from tools.a2a.task_store import BoundedTaskStore
from tools.daemon.hosts import Hosts
from tools.daemon.http.a2a import BEYOND_LOOPBACK
from tools.server import peer_labels
from tools.server.runtime import Runtime
from tools.settings import A2ASettings

log = logging.getLogger("macula.a2a")

PREFIX: Final = "/a2a/"
MAX_BODY: Final = 256 * 1024
_SEGMENT: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")
_HEX64: Final = re.compile(r"[0-9a-f]{64}")
_base_url: contextvars.ContextVar[str] = contextvars.ContextVar("a2a_base_url", default="")


class DoorHandler(DefaultRequestHandler):
    """The SDK's handler, with the message checked first (parts and mesh bounds), so a bad one
    is the A2A error it names before a task exists."""

    def __init__(self, limits: Callable[[], TaskLimits], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.limits = limits

    def _check(self, params: SendMessageRequest) -> None:
        message_value(params.message, self.limits(), answer=bool(params.message.task_id))

    async def on_message_send(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> Message | Task:
        self._check(params)
        answer: Message | Task = await super().on_message_send(params, context)
        return answer

    async def on_message_send_stream(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> AsyncGenerator[Event]:
        self._check(params)
        inner = super().on_message_send_stream(params, context)
        try:
            async for event in inner:
                yield event
        finally:
            await inner.aclose()


@dataclass
class _Served:
    node_id: str
    app: Starlette
    handler: DoorHandler
    executor: MeshExecutor


def _json(
    status: int, body: dict[str, Any], *extra: tuple[bytes, bytes]
) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
    data = json.dumps(body).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(data)).encode()),
        (b"cache-control", b"no-store"),
        *extra,
    ]
    return status, data, headers


async def _answer(send: Send, reply: tuple[int, bytes, list[tuple[bytes, bytes]]]) -> None:
    status, body, headers = reply
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _error(
    status: int, code: int, message: str, *extra: tuple[bytes, bytes]
) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
    """A refusal before JSON-RPC runs, said as a JSON-RPC error too (id null)."""
    return _json(
        status,
        {"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": message}},
        *extra,
    )


class Door:
    """The A2A door of one daemon (``async with``; then an ASGI app)."""

    def __init__(self, hosts: Hosts, home: Path, settings: A2ASettings | None = None) -> None:
        self.hosts = hosts
        self.home = home
        self.settings = settings or A2ASettings()
        self.requesters = Requesters(home)
        self.served: dict[str, _Served] = {}

    async def __aenter__(self) -> Door:
        await self.requesters.__aenter__()
        peer_labels.NAMERS.append(self.client_label)
        return self

    def client_label(self, node_id: bytes) -> str | None:
        """What the agents of this process call a node id that is one of this home's A2A
        clients (the owner's records: the mesh attested the node id)."""
        wanted = node_id.hex()
        for client in tokens.clients(self.home):
            if client.node_id == wanted:
                return f"A2A client {client.name} (through this home's A2A door)"
        return None

    async def __aexit__(self, *exc_info: object) -> None:
        with contextlib.suppress(ValueError):
            peer_labels.NAMERS.remove(self.client_label)
        for served in self.served.values():
            await served.executor.close()
            with contextlib.suppress(Exception):
                await served.handler.aclose()
        await self.requesters.__aexit__(*exc_info)

    # -- which agent ---------------------------------------------------------------------------

    def runtime(self, segment: str) -> tuple[str | None, Runtime | None]:
        """(node id hex, its open runtime) for a path segment: a node id hosted here, or an
        agent name with a key in this home; (None, None): no such agent."""
        node_id: str | None = None
        if _HEX64.fullmatch(segment) and segment in self.hosts.by_id:
            node_id = segment
        else:
            with contextlib.suppress(MaculaError, OSError):
                node_id = load_identity(self.home / "agents" / f"{segment}.key").node_id.hex()
        if node_id is None:
            return None, None
        hosted = self.hosts.by_id.get(node_id)
        runtime = None if hosted is None or hosted.closing.is_set() else hosted.runtime
        return node_id, runtime

    def _app(self, segment: str, node_id: str) -> _Served:
        served = self.served.get(segment)
        if served is not None and served.node_id == node_id:
            return served
        base = f"{PREFIX}{segment}/"

        def limits() -> TaskLimits:
            _, runtime = self.runtime(segment)
            return runtime.agent.tasks.limits if runtime is not None else TaskLimits()

        async def requester(node_id: str) -> tuple[Tasks, str]:
            return await self._requester(segment, node_id)

        card = self._card(segment, node_id)
        store = BoundedTaskStore()
        executor = MeshExecutor(bytes.fromhex(node_id), requester, limits, store)
        handler = DoorHandler(limits, agent_executor=executor, task_store=store, agent_card=card)

        async def signed(_: AgentCard) -> AgentCard:
            return self.signed_card(segment)

        routes = [
            *create_agent_card_routes(
                card, card_modifier=signed, card_url=base.rstrip("/") + AGENT_CARD_WELL_KNOWN_PATH
            ),
            *create_jsonrpc_routes(handler, rpc_url=base),
        ]
        served = _Served(node_id, Starlette(routes=routes), handler, executor)
        self.served[segment] = served
        return served

    def _card(self, segment: str, node_id: str) -> AgentCard:
        _, runtime = self.runtime(segment)
        policy = runtime.agent.rings.policy() if runtime is not None else None
        base = _base_url.get() or "http://127.0.0.1"
        return agent_card(
            segment,
            bytes.fromhex(node_id),
            f"{base}{PREFIX}{segment}/",
            policy.offers if policy is not None else (),
            policy.mode.label if policy is not None else "unknown",
        )

    def signed_card(self, segment: str) -> AgentCard:
        node_id, runtime = self.runtime(segment)
        if node_id is None or runtime is None:
            raise LookupError(segment)
        return sign_card(self._card(segment, node_id), runtime.node.identity)

    async def _requester(self, segment: str, node_id: str) -> tuple[Tasks, str]:
        """The requester of the client with mesh node id ``node_id`` (hex), and its name."""
        _, runtime = self.runtime(segment)
        if runtime is None:
            raise ConfigError(f"agent {segment} is no longer hosted here")
        clients = tokens.clients(self.home)
        self.requesters.close_gone({c.node_id for c in clients})
        client = next((c for c in clients if c.node_id == node_id), None)
        if client is None:
            raise ConfigError("this A2A client was revoked")
        if not runtime.agent.presence.said_goodbye:
            await runtime.agent.ensure_present()  # reachable on the mesh before it is handed work
        tasks = await self.requesters.tasks(
            client,
            runtime.stations,
            known_stations_from_env(runtime.env),
            runtime.agent.tasks.limits,
        )
        return tasks, client.name

    # -- the ASGI app --------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        path: str = scope["path"]
        segment, _, rest = path[len(PREFIX) :].partition("/")
        if not path.startswith(PREFIX) or not _SEGMENT.fullmatch(segment):
            await _answer(send, _error(404, -32601, "no such A2A agent here"))
            return
        node_id, runtime = self.runtime(segment)
        if node_id is None:
            await _answer(send, _error(404, -32601, f"no agent {segment} in this home"))
            return
        if runtime is None:
            await _answer(
                send,
                _error(
                    503, -32603,
                    f"agent {segment} is not running: start a session of it (its harness, "
                    f"or macula-mcp attach with {AGENT_ENV}={segment})",
                    (b"retry-after", b"5"),
                ),
            )  # fmt: skip
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        token = _base_url.set(self._base(scope))
        try:
            served = self._app(segment, node_id)
            if "/" + rest == AGENT_CARD_WELL_KNOWN_PATH and scope["method"] in ("GET", "HEAD"):
                await served.app(scope, receive, send)
                return
            await self._guarded(served, segment, scope, headers, receive, send)
        finally:
            _base_url.reset(token)

    def _base(self, scope: Scope) -> str:
        """The base URL a card names: the public one for a request that came through the
        listener beyond loopback (``DoorOnly`` marks it), else the socket the request reached.
        Never the ``Host`` header: the agent's key would sign whatever URL a caller wrote."""
        if scope.get(BEYOND_LOOPBACK) and self.settings.public_url:
            return self.settings.public_url
        host, port = scope.get("server") or ("127.0.0.1", 80)
        shown = f"[{host}]" if ":" in str(host) else str(host)
        return f"{scope.get('scheme', 'http')}://{shown}:{port}"

    async def _guarded(
        self,
        served: _Served,
        segment: str,
        scope: Scope,
        headers: dict[str, str],
        receive: Receive,
        send: Send,
    ) -> None:
        scheme, _, presented = headers.get("authorization", "").partition(" ")
        client = (
            tokens.identify(self.home, presented.strip()) if scheme.lower() == "bearer" else None
        )
        if client is None:
            challenge = (b"www-authenticate", b'Bearer realm="macula-a2a", error="invalid_token"')
            await _answer(
                send,
                _error(401, -32600, "no valid bearer token: the agent's owner makes one with "
                       "macula-mcp a2a-token create NAME --agent AGENT", challenge),
            )  # fmt: skip
            return
        if client.agent not in (segment,) and not self._same_agent(client.agent, segment):
            await _answer(send, _error(403, -32600, "this token reaches another agent"))
            return
        length = headers.get("content-length", "0")
        too_big = _error(413, -32600, f"a request is at most {MAX_BODY} bytes")
        if not length.isdecimal() or int(length) > MAX_BODY:
            await _answer(send, too_big)
            return
        body = await _body(receive)
        if body is None:  # the client went away
            return
        if len(body) > MAX_BODY:  # a body without Content-Length (chunked) past the bound
            await _answer(send, too_big)
            return
        # the SDK keeps a request's headers in its call context (and logs that at debug): the
        # token stops here. The SDK's user (the owner of its tasks) is the client's node id,
        # never its name: a name can be given again, after a revoke, to someone else
        kept = [(k, v) for k, v in scope["headers"] if k.lower() != b"authorization"]
        scope = dict(
            scope, headers=kept, user=SimpleUser(client.node_id), auth=AuthCredentials(["a2a"])
        )
        await served.app(scope, _replayed(body, receive), send)

    def _same_agent(self, agent: str, segment: str) -> bool:
        """Whether name ``agent`` and path ``segment`` are one agent (a node id or its name)."""
        mine, _ = self.runtime(agent)
        theirs, _ = self.runtime(segment)
        return mine is not None and mine == theirs


async def _body(receive: Receive) -> bytes | None:
    """The request's body, read up to one byte past ``MAX_BODY`` (a body without
    Content-Length is bounded here too); None if the client disconnected."""
    chunks: list[bytes] = []
    seen = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunk = message.get("body", b"")
        chunks.append(chunk)
        seen += len(chunk)
        if seen > MAX_BODY or not message.get("more_body", False):
            return b"".join(chunks)


def _replayed(body: bytes, receive: Receive) -> Receive:
    """``receive`` for the SDK: the body read already, then the client's own messages (its
    disconnect, while a stream is answered)."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def replayed() -> Any:
        return pending.pop() if pending else await receive()

    return replayed
