"""Serving procedures: which handlers this node offers, and running one call or stream.

Invariants:
- a handler's exception is a bug of the serving side: it is logged here with its traceback and
  counted (``handler_errors``); the caller gets ERROR 0x0F ``handler_error`` (a stream,
  STREAM_ERROR ``handler_error``) and never the exception's text, which may hold local state;
- a handler that means to refuse raises ``CallRefused(reason)``: that reason, and only it, is
  sent to the caller (same codes);
- an unencodable result becomes ERROR 0x0F ``result not encodable``; a lost session only logs;
- at most ``max_in_flight`` handlers (calls and streams together) run at once: one more is
  answered ERROR 0x08 ``upstream_congestion`` (a stream, STREAM_ERROR ``upstream_congestion``)
  without running, and counted (``calls_refused_busy``). A handler leaves the count when it
  ends, however it ends;
- a call's handler is called at once, in the callback that delivered the CALL: a plain
  function's result is answered there (the RESULT leaves in the same transmit as the QUIC ACK,
  no task and no loop turn per call); only an awaitable result gets a task of the node, which
  awaits it and answers. A node that is closing runs no handler.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import Any, Final, Protocol

from macula.errors import MaculaError, MeshError
from macula.node.session import Session, StreamChannel
from macula.wire.codes import ErrorCode
from macula.wire.errors import WireError
from macula.wire.frames import Call, StreamOpen

log = logging.getLogger("macula.node.node")

HANDLER_ERROR = "handler_error"
DEFAULT_MAX_IN_FLIGHT: Final = 64
BUSY = ErrorCode.UPSTREAM_CONGESTION  # 0x08, retry after an exponential backoff (§9)
BUSY_DETAIL = "too many calls in flight at this node"

Key = tuple[bytes, str]  # (realm, procedure)
# what a plain handler commonly returns: exactly these types are never awaitable (a subclass
# may be), so the result is answered without asking ``inspect.isawaitable``
_PLAIN_RESULTS = frozenset((bytes, str, int, float, dict, list, tuple, type(None)))


@dataclass(frozen=True, slots=True)
class IncomingCall:
    realm: bytes
    procedure: str
    payload: Any
    caller: bytes
    deadline_ms: int


Handler = Callable[[IncomingCall], Any]
StreamHandler = Callable[[StreamChannel, IncomingCall], Awaitable[Any]]


class CallRefused(Exception):
    """Raised by a handler to refuse a call with a reason meant for the caller."""


class ServeCounters(Protocol):
    calls_served: int
    handler_errors: int
    calls_refused_busy: int


@dataclass(slots=True)
class _Served:
    handler: Handler | None = None
    stream_handler: StreamHandler | None = None


class Server:
    """The procedures a node serves; iterating yields their (realm, procedure) keys.

    ``spawn`` runs a handler's coroutine as a task of the node (or closes it when the node is
    closing); ``stats`` counts served calls, handler errors and calls refused as busy.
    """

    def __init__(
        self,
        stats: ServeCounters,
        spawn: Callable[[Coroutine[Any, Any, None]], None],
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
    ) -> None:
        if type(max_in_flight) is not int or max_in_flight < 1:
            raise ValueError(f"max_in_flight must be a positive integer, not {max_in_flight!r}")
        self._served: dict[Key, _Served] = {}
        self._stats = stats
        self._spawn = spawn
        self.max_in_flight = max_in_flight
        self.in_flight = 0

    def __iter__(self) -> Iterator[Key]:
        return iter(self._served)

    def serve(self, realm: bytes, procedure: str, handler: Handler) -> None:
        self._served[(realm, procedure)] = _Served(handler=handler)

    def serve_stream(self, realm: bytes, procedure: str, handler: StreamHandler) -> None:
        self._served[(realm, procedure)] = _Served(stream_handler=handler)

    def withdraw(self, realm: bytes, procedure: str) -> bool:
        """Stop serving; True when it was served."""
        return self._served.pop((realm, procedure), None) is not None

    # -- dispatch ------------------------------------------------------------------------------

    def call_received(self, session: Session, stream: int, call: Call) -> None:
        served = self._served.get((call.realm, call.procedure))
        if served is None or served.handler is None:
            session.reply_error(stream, call, ErrorCode.UNKNOWN_NEXT_PEER, None)
            return
        if self._busy():
            with contextlib.suppress(MaculaError, WireError):
                session.reply_error(stream, call, BUSY, BUSY_DETAIL)
            return
        incoming = IncomingCall(
            call.realm, call.procedure, call.payload, call.caller, call.deadline_ms
        )
        try:
            result = served.handler(incoming)
        except Exception as exc:
            reason = self._failed(call.procedure, exc)
            _answer_error(session, stream, call, reason or HANDLER_ERROR)
            return
        if type(result) not in _PLAIN_RESULTS and inspect.isawaitable(result):
            work = self._serve_call(session, stream, call, result)
            if not self._start(work) and inspect.iscoroutine(result):
                result.close()  # the node is closing: never awaited, and says nothing
            return
        self._stats.calls_served += 1
        _answer(session, stream, call, result)

    def stream_opened(self, channel: StreamChannel, opening: StreamOpen) -> None:
        served = self._served.get((opening.realm, opening.procedure))
        if served is None or served.stream_handler is None:
            channel.fail("not_found", f"{opening.procedure} is not served here")
            return
        if self._busy():
            with contextlib.suppress(MaculaError, WireError):
                channel.fail(BUSY.wire_name, BUSY_DETAIL)
            return
        incoming = IncomingCall(
            opening.realm, opening.procedure, opening.args, opening.caller, opening.deadline_ms
        )
        self._start(self._serve_stream(channel, incoming, served.stream_handler))

    def _busy(self) -> bool:
        if self.in_flight < self.max_in_flight:
            return False
        self._stats.calls_refused_busy += 1
        return True

    def _start(self, work: Coroutine[Any, Any, None]) -> bool:
        """Run a handler counted in ``in_flight``; its ``finally`` gives the slot back, or here
        when the node refused to run it (closed before it started: False)."""
        self.in_flight += 1
        self._spawn(work)
        if inspect.getcoroutinestate(work) == inspect.CORO_CLOSED:
            self.in_flight -= 1
            return False
        return True

    # -- running one -----------------------------------------------------------------------------

    def _failed(self, procedure: str, exc: Exception) -> str | None:
        """Count a handler's failure and log a bug; the refusal's reason, if it is one."""
        self._stats.handler_errors += 1
        if isinstance(exc, CallRefused):
            return str(exc) or None
        log.exception("handler of %s failed", procedure, exc_info=exc)
        return None

    async def _serve_call(
        self, session: Session, stream: int, call: Call, pending: Awaitable[Any]
    ) -> None:
        try:
            result = await pending
        except Exception as exc:
            reason = self._failed(call.procedure, exc)
            _answer_error(session, stream, call, reason or HANDLER_ERROR)
            return
        finally:
            self.in_flight -= 1
        self._stats.calls_served += 1
        _answer(session, stream, call, result)

    async def _serve_stream(
        self, channel: StreamChannel, incoming: IncomingCall, handler: StreamHandler
    ) -> None:
        try:
            result = await handler(channel, incoming)
            if not channel.closed:
                if result is None:
                    channel.end("both")
                else:
                    channel.send_reply(result)
        except Exception as exc:
            reason = self._failed(incoming.procedure, exc)
            with contextlib.suppress(MaculaError, WireError):
                if not channel.closed:
                    channel.fail(HANDLER_ERROR, reason or "the handler failed")
        finally:
            self.in_flight -= 1


def _answer(session: Session, stream: int, call: Call, result: Any) -> None:
    """Send a RESULT; a lost session is logged, an unencodable result becomes ERROR 0x0F, and
    one more than a frame carries (``macula.client.send_limits``) ERROR 0x0D naming what."""
    try:
        session.reply(stream, call, result)
    except MeshError as exc:  # refused before sending: the caller hears why, not a timeout
        log.warning("handler result not sent: %s", exc)
        _answer_error(session, stream, call, f"result: {exc}", exc.code)
    except MaculaError as exc:
        log.info("reply not sent: %s", exc)
    except WireError as exc:
        log.warning("handler result not encodable: %s", exc)
        _answer_error(session, stream, call, f"result not encodable: {exc.detail}")


def _answer_error(
    session: Session, stream: int, call: Call, detail: str, code: int = ErrorCode.UNKNOWN_ERROR
) -> None:
    try:
        session.reply_error(stream, call, code, detail)
    except (MaculaError, WireError) as exc:
        log.info("error reply not sent: %s", exc)
