"""The console's routes (a Starlette app): the page, its static files, the live feed and the
person's writes. ``tools.daemon.http.listener`` puts the guard (token, origin, headers) in front.

Invariants:
- GET ``/`` is the page, ``/static/<name>`` its files (a fixed list: no path from the request
  reaches the file system), ``/events`` the live feed, ``/api/snapshot`` one snapshot,
  ``/api/audit`` the hosted identities' audit trails (``audit_view``, read-only);
- GET ``/api/owner`` the owner's switches (``owner_view``);
- GET ``/api/approvals`` and POST ``/api/approvals/decide`` are the owner's approval queue
  (``approvals_view``);
- POST ``/api/{say,ring,task,realm,owner}`` take a JSON object (at most ``MAX_BODY`` bytes) and
  answer ``{"ok": 1, ...}`` or, with HTTP 400, ``{"ok": 0, code, detail, retryable,
  next_action}``; a mesh failure is a 502 of the same shape, a bug a 500 (logged).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any, Final

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from macula.agent.petnames import petname
from macula.errors import MaculaError
from tools.daemon.console import actions, approvals_view, owner_view
from tools.daemon.console.audit_view import audit_view
from tools.daemon.console.feed import ChangeBell, events
from tools.daemon.console.person_key import person_identity
from tools.daemon.console.snapshot import ConsoleSource, DirectoryCache, snapshot

log = logging.getLogger("macula.console")

MAX_BODY: Final = 64 * 1024
STATIC: Final = {
    "console.js": "text/javascript; charset=utf-8",
    "console.css": "text/css; charset=utf-8",
    "owner.js": "text/javascript; charset=utf-8",
    "audit.js": "text/javascript; charset=utf-8",
    "approvals.js": "text/javascript; charset=utf-8",
}


def _static(name: str) -> bytes:
    return resources.files("tools.daemon.console").joinpath("static", name).read_bytes()


class Console:
    """The console of one daemon: its source of runtimes, the person key, the live feed."""

    def __init__(self, source: ConsoleSource, clock: Callable[[], float] = time.monotonic):
        self.source = source
        self.clock = clock
        self.person = person_identity(source.home)
        self.bell = ChangeBell()
        self.directory = DirectoryCache(clock)

    def person_view(self) -> dict[str, Any]:
        return {"node_id": self.person.node_id.hex(), "petname": petname(self.person.node_id)}

    async def read(self) -> dict[str, Any]:
        runtimes = self.source.runtimes()
        self.bell.watch(runtimes)
        return await snapshot(self.source, self.directory, self.person_view())

    def close(self) -> None:
        self.bell.closed.set()

    # -- routes ---------------------------------------------------------------------------------

    async def page(self, request: Request) -> Response:
        return Response(_static("index.html"), media_type="text/html; charset=utf-8")

    async def static(self, request: Request) -> Response:
        name = request.path_params["name"]
        if name not in STATIC:
            return Response("not found", status_code=404, media_type="text/plain")
        return Response(_static(name), media_type=STATIC[name])

    async def feed(self, request: Request) -> Response:
        headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
        stream = events(self.bell, self.read, self.clock)
        return StreamingResponse(stream, media_type="text/event-stream", headers=headers)

    async def one_snapshot(self, request: Request) -> Response:
        return JSONResponse(await self.read())

    async def audit(self, request: Request) -> Response:
        return JSONResponse(await audit_view(self.source.runtimes()))

    async def say(self, request: Request) -> Response:
        return await self._act(request, lambda b: actions.say(self._runtime(b), self.person, b))

    async def ring(self, request: Request) -> Response:
        return await self._act(request, lambda b: actions.answer_ring(self._runtime(b), b))

    async def task(self, request: Request) -> Response:
        return await self._act(request, lambda b: actions.hand_task(self._runtime(b), b))

    async def realm(self, request: Request) -> Response:
        return await self._act(request, lambda b: actions.decide_join(self.source.home, b))

    async def owner(self, request: Request) -> Response:
        try:
            found = owner_view.view(self.source.home, request.query_params.get("agent"))
        except actions.ActionError as exc:
            return JSONResponse({"ok": 0} | exc.view(), status_code=400)
        return JSONResponse({"ok": 1} | found)

    async def owner_change(self, request: Request) -> Response:
        return await self._act(request, lambda b: owner_view.change(self.source.home, b))

    async def approvals(self, request: Request) -> Response:
        return JSONResponse(await approvals_view.pending(self.source.home, self.source.runtimes()))

    async def decide_approval(self, request: Request) -> Response:
        return await self._act(
            request, lambda b: approvals_view.decide(self.source.home, self.source.runtimes(), b)
        )

    def _runtime(self, body: dict[str, Any]) -> Any:
        return actions.runtime_of(self.source.runtimes(), body)

    async def _act(
        self, request: Request, work: Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]
    ) -> Response:
        try:
            body = await _json_body(request)
            result = await work(body)
        except actions.ActionError as exc:
            return JSONResponse({"ok": 0} | exc.view(), status_code=400)
        except MaculaError as exc:
            failure = actions.ActionError(getattr(exc, "code", "mesh_error"), str(exc))
            return JSONResponse({"ok": 0} | failure.view(), status_code=502)
        except Exception:
            log.exception("a console action failed")
            failure = actions.ActionError("internal_error", "the daemon failed; see its log")
            return JSONResponse({"ok": 0} | failure.view(), status_code=500)
        self.bell.ring()
        return JSONResponse({"ok": 1} | result)

    def routes(self) -> list[Route]:
        return [
            Route("/", self.page, methods=["GET"]),
            Route("/static/{name}", self.static, methods=["GET"]),
            Route("/events", self.feed, methods=["GET"]),
            Route("/api/snapshot", self.one_snapshot, methods=["GET"]),
            Route("/api/audit", self.audit, methods=["GET"]),
            Route("/api/say", self.say, methods=["POST"]),
            Route("/api/ring", self.ring, methods=["POST"]),
            Route("/api/task", self.task, methods=["POST"]),
            Route("/api/realm", self.realm, methods=["POST"]),
            Route("/api/owner", self.owner, methods=["GET"]),
            Route("/api/owner", self.owner_change, methods=["POST"]),
            Route("/api/approvals", self.approvals, methods=["GET"]),
            Route("/api/approvals/decide", self.decide_approval, methods=["POST"]),
        ]

    def app(self) -> Starlette:
        return Starlette(routes=self.routes())


async def _json_body(request: Request) -> dict[str, Any]:
    if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
        raise actions.ActionError("invalid_argument", "the body must be application/json")
    raw = b""
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > MAX_BODY:
            raise actions.ActionError("invalid_argument", f"the body is over {MAX_BODY} bytes")
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise actions.ActionError("invalid_argument", "the body is not JSON") from None
    if not isinstance(body, dict):
        raise actions.ActionError("invalid_argument", "the body must be a JSON object")
    return body
