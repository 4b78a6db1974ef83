"""The one argument parser (relay.builtins.arguments) and the one Refused -> Outcome boundary
(answer)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from macula.wire.codes import ErrorCode
from relay.builtins.arguments import (
    arguments,
    bytes_arg,
    caller_id,
    handler_for,
    integer,
    kind,
    number,
    optional_map,
    optional_text,
    required,
    text,
)
from relay.builtins.outcome import Outcome, Refused, answer

LOG = logging.getLogger("macula.relay.test")


def refusal_of(check: object) -> str:
    """The detail of the ``Refused`` that calling ``check`` raises."""
    assert callable(check)
    with pytest.raises(Refused) as refused:
        check()
    assert refused.value.code == ErrorCode.UNKNOWN_ERROR
    return refused.value.detail.decode()


def test_answer_turns_results_refusals_and_crashes_into_outcomes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def result() -> object:
        return {"ok": 1}

    async def refuse() -> object:
        raise Refused(ErrorCode.PAYLOAD_TOO_LARGE, "payload_too_large", "x" * 1000)

    async def crash() -> object:
        raise RuntimeError("disk on fire")

    assert asyncio.run(answer("p.ok", result, LOG)) == Outcome.result({"ok": 1})
    refused = asyncio.run(answer("p.refuse", refuse, LOG))
    assert refused.code == ErrorCode.PAYLOAD_TOO_LARGE and refused.detail is not None
    assert refused.detail.startswith(b"payload_too_large: ") and len(refused.detail) == 300
    with caplog.at_level(logging.ERROR, logger=LOG.name):
        crashed = asyncio.run(answer("p.crash", crash, LOG))
    assert crashed == Outcome.error(ErrorCode.TEMPORARY_RELAY_FAILURE)
    (record,) = [r for r in caplog.records if r.name == LOG.name]
    assert record.exc_info is not None and "p.crash" in record.getMessage()


def test_null_counts_as_absent_and_details_name_kinds_not_values() -> None:
    assert optional_map(None) == {}
    assert (
        refusal_of(lambda: arguments(None)) == "bad_request: the argument must be a map, got null"
    )
    assert refusal_of(lambda: required({"k": None}, "k")) == "bad_request: missing 'k'"
    assert integer({"n": None}, "n", 1, 9, default=5) == 5
    assert "got a huge int" in refusal_of(lambda: integer({"n": 2**80}, "n", 1, 9))
    assert "got bytes(3)" in refusal_of(lambda: bytes_arg({"b": b"abc"}, "b", 4))
    assert "must be a number -1..1" in refusal_of(lambda: number({"x": float("nan")}, "x", -1, 1))
    assert optional_text({"t": None}, "t") is None
    assert "with lone surrogates" in refusal_of(lambda: text("\ud800", "t", high=5))
    assert "NUL" in refusal_of(lambda: text("a\x00b", "t"))
    assert text("a\x00b", "t", nul_ok=True) == "a\x00b"
    assert kind("x" * 10_000) == "text(10000 chars)"


def test_procedures_and_callers() -> None:
    handlers = {"a.one_v1": 1, "a.two_v1": 2}
    assert handler_for(handlers, "a.two_v1") == 2
    detail = refusal_of(lambda: handler_for(handlers, 7))
    assert detail == "unknown_procedure: this service answers a.one_v1, a.two_v1"
    assert caller_id(bytes(32), "unauthorized") == bytes(32)
    assert refusal_of(lambda: caller_id(b"short", "unauthorized")).startswith("unauthorized: ")
