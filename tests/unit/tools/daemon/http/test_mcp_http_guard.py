"""The pure parts of MCP over HTTP: Host/Origin/bearer checks and the bounded event store."""

from __future__ import annotations

import json

import pytest
from mcp.server.streamable_http import EventMessage
from mcp_types import JSONRPCNotification

from tools.daemon.http.events import BoundedEventStore
from tools.daemon.http.guard import bearer_token, host_allowed, origin_allowed, refusal

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize(
    ("host", "allowed"),
    [
        ("127.0.0.1:8080", True),
        ("127.9.9.9", True),
        ("localhost:1", True),
        ("LOCALHOST", True),
        ("[::1]:9", True),
        ("evil.example", False),
        ("127.0.0.1.evil.example", False),
        ("10.0.0.1:80", False),
        ("127.0.0.1:99999", False),
        ("", False),
        (None, False),
    ],
)
def test_host(host: str | None, allowed: bool) -> None:
    assert host_allowed(host) is allowed


@pytest.mark.parametrize(
    ("origin", "allowed"),
    [
        (None, True),
        ("http://127.0.0.1:5000", True),
        ("https://localhost", True),
        ("http://[::1]:1", True),
        ("null", False),
        ("http://evil.example", False),
        ("http://localhost.evil.example", False),
        ("file://localhost", False),
        ("vscode-webview://abc", False),
    ],
)
def test_origin(origin: str | None, allowed: bool) -> None:
    assert origin_allowed(origin) is allowed


def test_bearer() -> None:
    assert bearer_token({"authorization": "Bearer abc"}) == "abc"
    assert bearer_token({"authorization": "bearer  abc "}) == "abc"
    assert bearer_token({"authorization": "Basic abc"}) is None
    assert bearer_token({"authorization": "Bearer"}) is None
    assert bearer_token({}) is None


def test_a_401_says_bearer_and_why() -> None:
    status, headers, body = refusal(401, "a bearer token is required")
    assert status == 401 and headers["www-authenticate"] == 'Bearer realm="macula"'
    assert json.loads(body)["error"]["message"] == "a bearer token is required"
    _, presented, _ = refusal(401, "x", presented=True)
    assert presented["www-authenticate"].endswith('error="invalid_token"')
    assert "www-authenticate" not in refusal(403, "x")[1]


def note(n: int) -> JSONRPCNotification:
    return JSONRPCNotification(jsonrpc="2.0", method="notifications/message", params={"n": n})


async def test_the_event_store_replays_one_stream_after_an_id_and_forgets_the_oldest() -> None:
    store = BoundedEventStore(limit=4)
    prime = await store.store_event("get", None)
    first = await store.store_event("get", note(1))
    await store.store_event("post-7", note(99))
    await store.store_event("get", note(2))
    sent: list[EventMessage] = []

    async def record(event: EventMessage) -> None:
        sent.append(event)

    assert await store.replay_events_after(prime, record) == "get"
    assert [e.message.params for e in sent] == [{"n": 1}, {"n": 2}]  # type: ignore[union-attr]
    sent.clear()
    assert await store.replay_events_after(first, record) == "get"
    assert [e.message.params for e in sent] == [{"n": 2}]  # type: ignore[union-attr]
    await store.store_event("get", note(3))  # the priming event is forgotten now
    assert await store.replay_events_after(prime, record) is None
    assert await store.replay_events_after("not-a-number", record) is None
    assert store.stored("get") == 3 and len(store.events) == 4
