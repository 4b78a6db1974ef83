"""What a built-in or a house service answers, and the one way a refusal becomes an answer.

``Outcome`` is a RESULT payload or an ERROR code with a detail; ``Refused`` is raised inside a
built-in or house service for an anticipated refusal and turned into an ``Outcome`` at one
boundary. Error details are ``<reason>: <text>`` in UTF-8, at most ``MAX_DETAIL_CHARS`` chars.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

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
    """An anticipated refusal inside a built-in; ``run`` turns it into an ERROR outcome."""

    def __init__(self, code: int, reason: str, text: str) -> None:
        super().__init__(f"{reason}: {text}")
        self.code = int(code)
        self.detail = _detail(reason, text)


def _detail(reason: str, text: str) -> bytes:
    message = f"{reason}: {text}"
    if len(message) > MAX_DETAIL_CHARS:
        message = message[: MAX_DETAIL_CHARS - 3] + "..."
    return message.encode("utf-8", "backslashreplace")
