"""The station's monitoring port: ``/healthz /status /connections /links /metrics`` and ``/``
(``/?page=N``: the page with the N-th ``monitor_page.CLIENTS_PER_PAGE`` connected clients).

``Monitor(station, lifecycle)`` serves them on the station's event loop
(``relay.monitor.http.MonitorServer``: GET/HEAD only, bounded, timed out, capped). Figures are
read when a request comes (``relay.monitor.figures``); the port costs nothing between requests.
It has no authentication: it binds loopback unless the operator says ``--monitor-public``.
"""

from __future__ import annotations

import json
from typing import Any

from relay.monitor import metrics
from relay.monitor import page as monitor_page
from relay.monitor.figures import (
    Lifecycle,
    connections_page,
    links,
    status,
    with_directory_names,
)
from relay.monitor.http import MonitorServer, Request, Response
from relay.station.station import Station

JSON = "application/json"


def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` too) -> (host, port); ``ValueError`` naming what is wrong."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdecimal() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{text!r} is not HOST:PORT (port 0..65535)")
    return host.strip("[]"), int(port)


def _json(document: Any, status_code: int = 200) -> Response:
    body = json.dumps(document, indent=1, sort_keys=True).encode() + b"\n"
    return Response(status_code, body, JSON)


def _int(query: dict[str, str], name: str, default: int) -> int:
    text = query.get(name, "")
    return int(text) if text.isdecimal() else default


class Monitor:
    def __init__(
        self,
        station: Station,
        lifecycle: Lifecycle,
        *,
        max_clients: int = 16,
        read_timeout_s: float = 5.0,
        clients_per_page: int = monitor_page.CLIENTS_PER_PAGE,
    ) -> None:
        self.station = station
        self.lifecycle = lifecycle
        self.clients_per_page = clients_per_page
        self.server = MonitorServer(
            self.handle,
            max_clients=max_clients,
            read_timeout_s=read_timeout_s,
            spawn=station.spawn,
        )
        self.address: tuple[str, int] = ("", 0)

    async def start(self, host: str, port: int) -> tuple[str, int]:
        self.address = await self.server.start(host, port)
        return self.address

    async def close(self) -> None:
        await self.server.close()

    async def status(self) -> dict[str, Any]:
        document = await status(self.station, self.lifecycle)
        document["monitor"] = {"clients": self.server.clients, **self.server.stats}
        return document

    async def handle(self, request: Request) -> Response:
        path = request.path.rstrip("/") or "/"
        if path == "/healthz":
            if self.lifecycle.serving and not self.station.core.stopping:
                return Response(200, b"ok\n")
            why = b"draining\n" if self.lifecycle.draining else b"not ready\n"
            return Response(503, why)
        if path == "/status":
            return _json(await self.status())
        if path == "/connections":
            offset = _int(request.query, "offset", 0)
            limit = _int(request.query, "limit", 100)
            page = connections_page(self.station, offset, limit)
            return _json(await with_directory_names(self.station, page))
        if path == "/links":
            return _json({"links": links(self.station)})
        if path == "/metrics":
            return Response(200, metrics.render(await self.status()), metrics.CONTENT_TYPE)
        if path == "/":
            number = min(max(1, _int(request.query, "page", 1)), monitor_page.MAX_PAGE_NUMBER)
            per_page = self.clients_per_page
            clients = connections_page(self.station, (number - 1) * per_page, per_page)
            clients = await with_directory_names(self.station, clients)
            html = monitor_page.render(await self.status(), links(self.station), clients, number)
            return Response(200, html, "text/html; charset=utf-8")
        return Response(404, b"no such page: /healthz /status /connections /links /metrics /\n")
