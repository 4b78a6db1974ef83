"""The A2A door's place on the daemon's listener: ``/a2a/`` goes to the door (whatever the
console's guard would say), the listener beyond loopback serves the door and nothing else, and
its settings are checked at start naming the variable."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tools.daemon.http.a2a import DoorOnly
from tools.daemon.http.listener import Guarded
from tools.settings import (
    A2A_LISTEN_ENV,
    A2A_URL_ENV,
    A2ASettings,
    DaemonSettingError,
    DaemonSettings,
)


class Recorder:
    def __init__(self, name: str) -> None:
        self.name, self.paths = name, []

    def app(self) -> Recorder:
        return self

    def close(self) -> None:
        pass

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.paths.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": self.name.encode()})


def call(app: Any, path: str) -> tuple[int, list[dict[str, Any]]]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": path, "headers": [], "query_string": b""}
    asyncio.run(app(scope, receive, send))
    return sent[0]["status"], sent


def test_the_listener_routes_a2a_to_the_door_and_the_rest_to_the_console() -> None:
    console, mcp, door = Recorder("console"), Recorder("mcp"), Recorder("door")
    app = Guarded(console, "t", mcp, door)  # type: ignore[arg-type]
    assert call(app, "/a2a/ada/")[0] == 200 and door.paths == ["/a2a/ada/"]
    assert call(app, "/mcp")[0] == 200 and mcp.paths == ["/mcp"]
    assert call(app, "/a2a")[0] == 421  # not the door's prefix: the console's guard (no Host)
    assert console.paths == []


def test_beyond_loopback_only_the_door_answers() -> None:
    door = Recorder("door")
    only = DoorOnly(door)  # type: ignore[arg-type]
    for path in ("/", "/mcp", "/?token=x", "/events", "/a2a"):
        assert call(only, path)[0] == 404, path
    assert call(only, "/a2a/ada/")[0] == 200


def test_a2a_settings_are_checked_naming_the_variable(tmp_path: Path) -> None:
    assert A2ASettings.from_env({}) == A2ASettings(None, None)
    got = A2ASettings.from_env({A2A_LISTEN_ENV: "0.0.0.0:8470", A2A_URL_ENV: "https://a.example/"})
    assert got == A2ASettings(("0.0.0.0", 8470), "https://a.example")
    assert A2ASettings.from_env({A2A_LISTEN_ENV: "[::1]:9"}).listen == ("::1", 9)
    for bad in ({A2A_LISTEN_ENV: "8470"}, {A2A_LISTEN_ENV: "h:0"}, {A2A_LISTEN_ENV: "h:x"},
                {A2A_URL_ENV: "ftp://x"}):  # fmt: skip
        with pytest.raises(DaemonSettingError, match=next(iter(bad))):
            DaemonSettings.from_env({"MACULA_HOME": str(tmp_path), **bad})
    daemon = DaemonSettings.from_env({"MACULA_HOME": str(tmp_path), A2A_LISTEN_ENV: "127.0.0.1:1"})
    assert daemon.a2a.listen == ("127.0.0.1", 1)


@pytest.mark.anyio
async def test_a_listen_address_it_cannot_bind_leaves_the_daemon_running(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A busy port (or an address not of this host) is logged naming the variable; the task
    ends on its own and the daemon's task group goes on (uvicorn's exit never escapes)."""
    import socket

    from tools.daemon.http.a2a import serve_beyond_loopback

    class Mount:
        stopping = asyncio.Event()

    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    try:
        async with asyncio.TaskGroup() as group:
            rest = group.create_task(asyncio.Event().wait(), name="the rest of the daemon")
            port = busy.getsockname()[1]
            await group.create_task(serve_beyond_loopback(Mount(), "127.0.0.1", port))  # type: ignore[arg-type]
            assert not rest.done()
            rest.cancel()
    finally:
        busy.close()
    assert f"{A2A_LISTEN_ENV}=127.0.0.1:{port}: cannot listen there" in caplog.text
