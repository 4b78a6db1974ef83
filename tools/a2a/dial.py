"""Dialling an allowlisted A2A agent with the official SDK client, and naming what went wrong.

Invariants:
- Every request goes through ``Guard``: one ``httpx`` transport that refuses, before any
  connection, a request to an origin other than the allowlisted entry's (a Card's interface
  pointing elsewhere, a redirect: redirects are not followed); proxies from the environment are
  not used (``trust_env`` off), so the only socket opened is to the listed host and port.
- A Card's interfaces on another origin are dropped before the SDK picks one; none left is
  ``a2a_not_allowlisted``. A Card that asks for credentials is ``a2a_auth_required``: the mesh
  sends none.
- ``failure_of`` turns any exception of a dial, a send, a get or a cancel into one ``Failure``
  (code, detail, retryable): ``a2a_unreachable`` (retryable), ``a2a_auth_required``,
  ``a2a_refused`` (an A2A error the agent named), ``a2a_malformed_answer``,
  ``a2a_not_allowlisted``. Details are bounded and carry no credentials (none exist).
"""

from __future__ import annotations

import json
from types import TracebackType
from typing import Final

import httpx
from a2a.client import (
    A2ACardResolver,
    A2AClientTimeoutError,
    AgentCardResolutionError,
    Client,
    ClientConfig,
    ClientFactory,
)
from a2a.types import AgentCard, InvalidAgentResponseError
from a2a.utils.constants import TransportProtocol
from a2a.utils.errors import A2AError
from google.protobuf.json_format import ParseError

from tools.a2a.allowlist import Agent, is_card_url, origin_of
from tools.a2a.answers import Malformed

CONNECT_S: Final = 5.0
REQUEST_S: Final = 30.0
DETAIL_CHARS: Final = 300
AUTH_STATUSES: Final = frozenset({401, 403})


class NotAllowed(httpx.TransportError):
    """A request to an origin the allowlist does not name: refused before any connection."""


class Guard(httpx.AsyncBaseTransport):
    """The one transport of an outbound client: only ``origin`` is ever dialled."""

    def __init__(self, origin: str, inner: httpx.AsyncBaseTransport | None = None) -> None:
        self.origin = origin
        self.inner = inner or httpx.AsyncHTTPTransport(retries=0)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if origin_of(str(request.url)) != self.origin:
            raise NotAllowed(
                f"{request.url.scheme}://{request.url.host}:{request.url.port} is not the "
                f"allowlisted origin {self.origin}",
                request=request,
            )
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


class Failure(Exception):
    """What went wrong with an A2A agent, as a tool says it."""

    def __init__(self, code: str, detail: str, retryable: bool = False) -> None:
        super().__init__(code, detail)
        self.code, self.detail, self.retryable = code, detail, retryable

    def __str__(self) -> str:
        return f"{self.code}: {self.detail}"


NEXT_ACTION: Final = {
    "a2a_unreachable": "try again later (mesh_task_send again, or mesh_task_wait: it retries)",
    "a2a_auth_required": "the A2A agent wants credentials the mesh does not send; tell the owner",
    "a2a_refused": "read detail; the A2A agent refused the request",
    "a2a_malformed_answer": "the A2A agent answered out of protocol; tell its owner",
    "a2a_not_allowlisted": "only the owner's [a2a] agents in owner.toml are dialled; ask the owner",
}


class Opened:
    """An SDK client to one agent over a guarded ``httpx`` client; ``async with`` closes both."""

    def __init__(self, card: AgentCard, http: httpx.AsyncClient, client: Client) -> None:
        self.card, self.http, self.client = card, http, client

    async def __aenter__(self) -> Opened:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        try:
            await self.client.close()
        finally:
            await self.http.aclose()


def http_client(agent: Agent, inner: httpx.AsyncBaseTransport | None = None) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=Guard(agent.origin, inner),
        follow_redirects=False,
        trust_env=False,
        timeout=httpx.Timeout(REQUEST_S, connect=CONNECT_S),
    )


async def dial(agent: Agent, card: AgentCard | None = None) -> Opened:
    """An SDK client to ``agent`` (its Card fetched unless given); a ``Failure`` if not."""
    http = http_client(agent)
    try:
        if card is None:
            card = await fetch_card(agent, http)
        config = ClientConfig(
            httpx_client=http,
            streaming=True,
            polling=not card.capabilities.streaming,
            supported_protocol_bindings=[TransportProtocol.JSONRPC, TransportProtocol.HTTP_JSON],
        )
        try:
            client = ClientFactory(config).create(card)
        except ValueError as exc:
            raise Failure("a2a_refused", f"no protocol binding in common: {_short(exc)}") from None
    except BaseException as exc:
        await http.aclose()
        if isinstance(exc, Exception):
            raise failure_of(exc) from exc
        raise
    return Opened(card, http, client)


async def fetch_card(agent: Agent, http: httpx.AsyncClient) -> AgentCard:
    """The agent's Card, checked: interfaces kept on the allowlisted origin only."""
    if is_card_url(agent.url):
        resolver = A2ACardResolver(http, agent.url, agent_card_path="")
    else:
        resolver = A2ACardResolver(http, agent.url)
    card = await resolver.get_agent_card()
    kept = [i for i in card.supported_interfaces if _same_origin(i.url, agent.origin)]
    if not kept:
        raise Failure(
            "a2a_not_allowlisted",
            f"the Agent Card at {agent.card_url} names no interface on {agent.origin}; "
            "macula dials only the allowlisted origin",
        )
    del card.supported_interfaces[:]
    card.supported_interfaces.extend(kept)
    if len(card.security_requirements) > 0:
        raise Failure(
            "a2a_auth_required",
            f"the Agent Card at {agent.card_url} asks for credentials; the mesh sends none",
        )
    return card


def _same_origin(url: str, origin: str) -> bool:
    try:
        return origin_of(url) == origin
    except ValueError:
        return False


MALFORMED: Final = (Malformed, ParseError, json.JSONDecodeError, InvalidAgentResponseError)


def failure_of(exc: BaseException) -> Failure:
    """The one ``Failure`` an exception of the SDK client (or of ``Guard``) stands for."""
    chain: list[BaseException] = []
    seen: BaseException | None = exc
    while seen is not None and len(chain) < 8:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    for item in chain:
        if isinstance(item, Failure):
            return item
        if isinstance(item, NotAllowed):
            return Failure("a2a_not_allowlisted", _short(item))
    for item in chain:
        status = _status(item)
        if status in AUTH_STATUSES:
            return Failure("a2a_auth_required", f"the A2A agent answered HTTP {status}")
        if status is not None:
            return Failure(
                "a2a_unreachable" if status >= 500 else "a2a_refused",
                f"the A2A agent answered HTTP {status}",
                retryable=status >= 500,
            )
    for item in chain:
        if isinstance(item, (httpx.TimeoutException, A2AClientTimeoutError)):
            return Failure("a2a_unreachable", "the A2A agent did not answer in time", True)
        if isinstance(item, httpx.TransportError):
            return Failure("a2a_unreachable", f"cannot reach the A2A agent: {_short(item)}", True)
    for item in chain:
        if isinstance(
            item, (Malformed, ParseError, json.JSONDecodeError, InvalidAgentResponseError)
        ):
            return Failure("a2a_malformed_answer", _short(item))
    first = chain[0]
    if isinstance(first, AgentCardResolutionError):
        return Failure("a2a_malformed_answer", f"its Agent Card: {_short(first)}")
    if type(first).__module__.startswith("a2a.utils.errors") and isinstance(first, A2AError):
        return Failure("a2a_refused", f"{type(first).__name__}: {_short(first)}")
    if isinstance(first, A2AError):  # the client's own: an answer it could not read
        return Failure("a2a_malformed_answer", _short(first))
    return Failure("a2a_malformed_answer", f"{type(first).__name__}: {_short(first)}")


def _status(exc: BaseException) -> int | None:
    if isinstance(exc, httpx.HTTPStatusError):
        return exc.response.status_code
    if isinstance(exc, AgentCardResolutionError) and exc.status_code is not None:
        return exc.status_code
    return None


def _short(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= DETAIL_CHARS else text[:DETAIL_CHARS] + "..."
