"""BOLT#4-style error codes of Macula wire v2 (PROTOCOL.md §9).

An ERROR frame's ``name`` is derived from its ``code``, never chosen independently. Codes up to
255 are wire-legal: a code we do not know parses as ``unknown_code_<n>`` with retry advice
"log" (retry with caution), so nothing a peer sends can make naming fail.
"""

from __future__ import annotations

from enum import IntEnum, StrEnum


class RetryAdvice(StrEnum):
    NONE = "none"
    DIFFERENT_PATH = "different_path"
    SAME_PATH_AFTER_BACKOFF = "same_path_after_backoff"
    RE_RESOLVE = "re_resolve"
    APPLICATION = "application"
    RECOMPUTE_ROUTE = "recompute_route"
    EXTEND_DEADLINE = "extend_deadline"
    EXPONENTIAL_BACKOFF = "exponential_backoff"
    DO_NOT_RETRY = "do_not_retry"
    RETRY_WITH_CAUTION = "retry_with_caution"


class ErrorCode(IntEnum):
    OK = 0x00
    UNKNOWN_NEXT_PEER = 0x01
    TEMPORARY_RELAY_FAILURE = 0x02
    RELAY_DISABLED = 0x03
    NODE_NOT_FOUND_AT_TARGET_RELAY = 0x04
    TARGET_REALM_REFUSED = 0x05
    LOOP_DETECTED = 0x06
    EXPIRY_TOO_SOON = 0x07
    UPSTREAM_CONGESTION = 0x08
    INVALID_PATH_HEADER = 0x09
    CRYPTO_PUZZLE_INVALID = 0x0A
    REALM_NOT_AUTHORITATIVE_HERE = 0x0B
    TOMBSTONED = 0x0C
    PAYLOAD_TOO_LARGE = 0x0D
    SIGNATURE_INVALID = 0x0E
    UNKNOWN_ERROR = 0x0F
    UNAUTHORIZED = 0x10

    @property
    def wire_name(self) -> str:
        """The ``name`` carried by an ERROR frame with this code."""
        return self.name.lower()

    @property
    def advice(self) -> RetryAdvice:
        return _ADVICE[self]

    @property
    def retryable(self) -> bool:
        return self.advice not in _NOT_RETRYABLE


_ADVICE: dict[ErrorCode, RetryAdvice] = {
    ErrorCode.OK: RetryAdvice.NONE,
    ErrorCode.UNKNOWN_NEXT_PEER: RetryAdvice.DIFFERENT_PATH,
    ErrorCode.TEMPORARY_RELAY_FAILURE: RetryAdvice.SAME_PATH_AFTER_BACKOFF,
    ErrorCode.RELAY_DISABLED: RetryAdvice.DIFFERENT_PATH,
    ErrorCode.NODE_NOT_FOUND_AT_TARGET_RELAY: RetryAdvice.RE_RESOLVE,
    ErrorCode.TARGET_REALM_REFUSED: RetryAdvice.APPLICATION,
    ErrorCode.LOOP_DETECTED: RetryAdvice.RECOMPUTE_ROUTE,
    ErrorCode.EXPIRY_TOO_SOON: RetryAdvice.EXTEND_DEADLINE,
    ErrorCode.UPSTREAM_CONGESTION: RetryAdvice.EXPONENTIAL_BACKOFF,
    ErrorCode.INVALID_PATH_HEADER: RetryAdvice.RECOMPUTE_ROUTE,
    ErrorCode.CRYPTO_PUZZLE_INVALID: RetryAdvice.DO_NOT_RETRY,
    ErrorCode.REALM_NOT_AUTHORITATIVE_HERE: RetryAdvice.RE_RESOLVE,
    ErrorCode.TOMBSTONED: RetryAdvice.APPLICATION,
    ErrorCode.PAYLOAD_TOO_LARGE: RetryAdvice.APPLICATION,
    ErrorCode.SIGNATURE_INVALID: RetryAdvice.DO_NOT_RETRY,
    ErrorCode.UNKNOWN_ERROR: RetryAdvice.RETRY_WITH_CAUTION,
    ErrorCode.UNAUTHORIZED: RetryAdvice.APPLICATION,
}
_NOT_RETRYABLE = frozenset({RetryAdvice.NONE, RetryAdvice.APPLICATION, RetryAdvice.DO_NOT_RETRY})


def code_name(code: int) -> str:
    """Wire name for any code 0..255 (``unknown_code_<n>`` for unassigned ones)."""
    try:
        return ErrorCode(code).wire_name
    except ValueError:
        return f"unknown_code_{code}"


def code_advice(code: int) -> RetryAdvice:
    try:
        return ErrorCode(code).advice
    except ValueError:
        return RetryAdvice.RETRY_WITH_CAUTION


def is_retryable(code: int) -> bool:
    """§9: everything except advice none, application and do-not-retry."""
    return code_advice(code) not in _NOT_RETRYABLE
