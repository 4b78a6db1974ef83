"""What a built-in's or a house service's argument must be: the one parser of peer arguments.

Invariants:
- Every check returns the checked value or raises ``Refused``, never anything else; the caller
  turns it into an answer at its one boundary (``relay.builtins.outcome.answer``).
- A malformed argument is 0x0F ``bad_request: <what>``, an oversize one 0x0D
  ``payload_too_large``, a procedure a service does not answer 0x0F ``unknown_procedure``.
- Details describe a peer value by its CBOR kind and size (``kind``), never by more of it than a
  number, so they stay short whatever the peer sent.
- A null value counts as absent: an optional key that is null takes its default, a required key
  that is null is missing. Extra keys are the caller's business (every service ignores them).
- Text is a ``str`` that encodes to UTF-8 (no lone surrogates); NUL characters only where the
  caller allows them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, TypeVar

from macula.wire.codes import ErrorCode
from relay.builtins.outcome import Refused

__all__ = [
    "NODE_ID_SIZE",
    "Args",
    "arguments",
    "bad_request",
    "bytes_arg",
    "caller_id",
    "handler_for",
    "integer",
    "is_text",
    "kind",
    "number",
    "optional_map",
    "optional_text",
    "refusal",
    "required",
    "text",
    "too_large",
]

Args = Mapping[object, object]
H = TypeVar("H")

NODE_ID_SIZE: Final = 32
HUGE_INT: Final = 10**20


# --- refusals ---------------------------------------------------------------------------------


def refusal(reason: str, text: str) -> Refused:
    """A 0x0F refusal ``<reason>: <text>``."""
    return Refused(ErrorCode.UNKNOWN_ERROR, reason, text)


def bad_request(text: str) -> Refused:
    return refusal("bad_request", text)


def too_large(what: str, size: int, limit: int) -> Refused:
    return Refused(
        ErrorCode.PAYLOAD_TOO_LARGE, "payload_too_large", f"{what} is {size} bytes, limit {limit}"
    )


def kind(value: object) -> str:
    """A short description of a peer value for error details (never more than a number)."""
    if type(value) is bool:
        return "bool"
    if value is None:
        return "null"
    if type(value) is int:
        return f"int {value}" if abs(value) < HUGE_INT else "a huge int"
    if type(value) is float:
        return f"float {value!r}"
    if isinstance(value, str):
        return f"text({len(value)} chars)"
    if isinstance(value, bytes):
        return f"bytes({len(value)})"
    if isinstance(value, list | tuple):
        return "array"
    return "map" if isinstance(value, Mapping) else type(value).__name__


def handler_for(handlers: Mapping[str, H], procedure: object) -> H:
    """The handler of ``procedure``, else ``unknown_procedure`` naming the ones there are."""
    handler = handlers.get(procedure) if type(procedure) is str else None
    if handler is None:
        raise refusal("unknown_procedure", f"this service answers {', '.join(handlers)}")
    return handler


def caller_id(caller: object, reason: str) -> bytes:
    """The caller's 32-byte node id, else a ``reason`` refusal."""
    if type(caller) is not bytes or len(caller) != NODE_ID_SIZE:
        raise refusal(reason, "the caller has no authenticated 32-byte node id")
    return caller


# --- maps and keys ----------------------------------------------------------------------------


def arguments(value: object, label: str = "the argument") -> Args:
    """``value`` as a map."""
    if not isinstance(value, Mapping):
        raise bad_request(f"{label} must be a map, got {kind(value)}")
    return value


def optional_map(value: object, label: str = "the argument") -> Args:
    """``value`` as a map; null counts as an empty one."""
    return {} if value is None else arguments(value, label)


def required(args: Args, name: str, label: str | None = None) -> object:
    """The value under ``name``; missing if absent or null."""
    value = args.get(name)
    if value is None:
        raise bad_request(f"missing {label or name!r}")
    return value


def bytes_arg(args: Args, name: str, size: int | None = None) -> bytes:
    """A required byte string, of exactly ``size`` bytes if given."""
    value = required(args, name)
    if type(value) is not bytes or (size is not None and len(value) != size):
        wanted = "bytes" if size is None else f"bytes({size})"
        raise bad_request(f"{name!r} must be {wanted}, got {kind(value)}")
    return value


def integer(
    args: Args,
    name: str,
    low: int,
    high: int,
    *,
    default: int | None = None,
    label: str | None = None,
) -> int:
    """An int ``low..high``; null or absent is ``default``, or missing if there is none."""
    label = label or name
    value = args.get(name)
    if value is None:
        if default is None:
            raise bad_request(f"missing {label!r}")
        return default
    if type(value) is not int or not low <= value <= high:
        raise bad_request(f"{label!r} must be an int {low}..{high}, got {kind(value)}")
    return value


def number(args: Args, name: str, low: float, high: float, *, label: str | None = None) -> float:
    """A required int or float ``low..high`` (never NaN), as a float."""
    label = label or name
    value = required(args, name, label)
    if not (type(value) is int or type(value) is float) or not low <= value <= high:
        raise bad_request(f"{label!r} must be a number {low:g}..{high:g}, got {kind(value)}")
    return float(value)


# --- text -------------------------------------------------------------------------------------


def is_text(value: object, low: int = 0, high: int | None = None) -> bool:
    """``value`` is a ``str`` of ``low..high`` characters that encodes to UTF-8."""
    if type(value) is not str or len(value) < low or (high is not None and len(value) > high):
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates: not text SQLite or CBOR can carry
        return False
    return True


def text(
    value: object,
    label: str,
    *,
    low: int = 0,
    high: int | None = None,
    nul_ok: bool = False,
) -> str:
    """``value`` as text of ``low..high`` characters; NUL characters only if ``nul_ok``."""
    if not is_text(value, low, high):
        span = "" if high is None else f"{low}..{high} characters of "
        got = kind(value)
        if type(value) is str and low <= len(value) and (high is None or len(value) <= high):
            got += " with lone surrogates"
        raise bad_request(f"{label!r} must be {span}text, got {got}")
    assert isinstance(value, str)
    if not nul_ok and "\x00" in value:
        raise bad_request(f"{label!r} must not contain NUL characters")
    return value


def optional_text(
    args: Args,
    name: str,
    *,
    low: int = 0,
    high: int | None = None,
    label: str | None = None,
    nul_ok: bool = False,
) -> str | None:
    """Text under ``name`` (see ``text``), or None if absent or null."""
    value = args.get(name)
    if value is None:
        return None
    return text(value, label or name, low=low, high=high, nul_ok=nul_ok)
