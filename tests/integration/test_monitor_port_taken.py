"""A monitor port in use is reported naming the monitor's address (``--monitor HOST:PORT``),
not the station's: a real listening socket holds the port."""

from __future__ import annotations

import socket

import pytest

from macula.errors import ConfigError
from relay.monitor.http import MonitorServer, Response

pytestmark = pytest.mark.anyio


async def test_a_taken_monitor_port_names_the_monitor_address() -> None:
    async def handler(request: object) -> Response:
        raise AssertionError("never called")

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(ConfigError) as raised:
            await MonitorServer(handler).start("127.0.0.1", port)
    said = str(raised.value)
    assert said.startswith(f"--monitor 127.0.0.1:{port}: cannot listen there") and "in use" in said
