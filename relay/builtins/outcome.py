"""What a built-in or a house service answers, and the one way a refusal becomes an answer.

``Outcome`` is a RESULT payload or an ERROR code with a detail; ``Refused`` is raised inside a
built-in or house service for an anticipated refusal and turned into an ``Outcome`` at one
boundary, ``answer``, which every built-in and house service goes through. Anything else reaching
it is a bug or a disk error: logged with its traceback, answered 0x02 with no detail.
Error details are ``<reason>: <text>`` in UTF-8, at most ``MAX_DETAIL_CHARS`` chars.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Final

from macula.wire.codes import ErrorCode

MAX_DETAIL_CHARS: Final = 300


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a built-in answers: a RESULT ``payload`` or an ERROR ``code`` with ``detail``."""

    payload: object = None
    code: int | None = None
    detail: bytes | None = None

    @classmethod
    def result(cls, payload: object) -> Outcome:
        return cls(payload=payload)

    @classmethod
    def error(cls, code: int, detail: bytes | None = None) -> Outcome:
        return cls(code=int(code), detail=detail)

    @property
    def is_error(self) -> bool:
        return self.code is not None


class Refused(Exception):
    """An anticipated refusal inside a built-in; ``answer`` turns it into an ERROR outcome."""

    def __init__(self, code: int, reason: str, text: str) -> None:
        super().__init__(f"{reason}: {text}")
        self.code = int(code)
        self.detail = _detail(reason, text)


def _detail(reason: str, text: str) -> bytes:
    message = f"{reason}: {text}"
    if len(message) > MAX_DETAIL_CHARS:
        message = message[: MAX_DETAIL_CHARS - 3] + "..."
    return message.encode("utf-8", "backslashreplace")


async def answer(
    procedure: object, work: Callable[[], Awaitable[object]], log: logging.Logger
) -> Outcome:
    """Run ``work``, one call of ``procedure``, to an ``Outcome``; never raises (but cancels).

    Its result is a RESULT; a ``Refused`` is its ERROR; any other exception is logged on ``log``
    with its traceback and answered 0x02 with no detail.
    """
    try:
        return Outcome.result(await work())
    except Refused as refused:
        return Outcome.error(refused.code, refused.detail)
    except Exception:
        log.exception("procedure %.100r failed", procedure)
        return Outcome.error(ErrorCode.TEMPORARY_RELAY_FAILURE)


# a house service's handler of one procedure: (payload, caller, now_ms) -> its result
Handler = Callable[[object, bytes, int], Awaitable[object]]


async def dispatch(
    handlers: Mapping[str, Handler],
    procedure: object,
    call: tuple[object, bytes, int],
    log: logging.Logger,
) -> Outcome:
    """Run the handler of ``procedure`` on ``call`` (payload, caller, now_ms) through
    ``answer``; 0x01 (``unknown_next_peer``) when the service has none. Never raises."""
    handler = handlers.get(procedure) if type(procedure) is str else None
    if handler is None:
        return Outcome.error(ErrorCode.UNKNOWN_NEXT_PEER)
    return await answer(procedure, lambda: handler(*call), log)
