"""The MCP server's plumbing without a mesh: identity choice, results, receipts."""

from __future__ import annotations

import asyncio
import json
import logging
import os
from pathlib import Path
from typing import Any, cast

import pytest

from macula.config import identity_path
from macula.errors import CallTimeout, ConfigError, MeshError
from macula.wire.identity import Identity
from tools.server.receipts import ReceiptStore, args_digest
from tools.server.results import (
    MAX_RESULT_BYTES,
    InvalidArgument,
    bounded,
    fail,
    from_error,
    ok,
    plain,
)
from tools.server.runtime import Runtime, agent_settings, check_key, run_tool


def test_identity_choice_follows_the_environment(tmp_path: Path) -> None:
    home = str(tmp_path)
    assert identity_path({"MACULA_HOME": home, "MACULA_MCP_IDENTITY": "/k/x.key"}) == Path(
        "/k/x.key"
    )
    assert (
        identity_path({"MACULA_HOME": home, "MACULA_MCP_AGENT": "ada"})
        == tmp_path / "agents" / "ada.key"
    )
    by_session = identity_path({"MACULA_HOME": home, "CLAUDE_CODE_SESSION_ID": "abc-123"})
    assert by_session == tmp_path / "sessions" / "abc-123.key"
    by_parent = identity_path({"MACULA_HOME": home})
    assert by_parent.parent == tmp_path / "sessions" and by_parent.name.startswith("ppid-")
    assert (
        identity_path({"MACULA_HOME": home, "CLAUDE_CODE_SESSION_ID": "../../etc"}).parent
        == tmp_path / "sessions"
    )
    with pytest.raises(ConfigError, match="MACULA_MCP_AGENT"):
        identity_path({"MACULA_HOME": home, "MACULA_MCP_AGENT": "../evil"})


def test_results_carry_no_booleans_and_stay_bounded() -> None:
    assert plain({"a": True, "b": [False, b"\x01"], "c": (1, 2)}) == {
        "a": 1,
        "b": [0, "01"],
        "c": [1, 2],
    }
    big = {"items": [{"n": i, "text": "x" * 100} for i in range(1000)], "keep": 1}
    cut = bounded(big)
    assert len(json.dumps(cut)) <= MAX_RESULT_BYTES + 200
    assert cut["truncated"] == 1 and cut["truncation"]["dropped"]["items"] > 0 and cut["keep"] == 1
    result = ok({"flag": True})
    assert result.structured_content == {"flag": 1} and not result.is_error
    error = fail("x", "y", retryable=True, next_action="z").structured_content
    assert error == {"code": "x", "detail": "y", "retryable": 1, "next_action": "z"}


@pytest.mark.parametrize(
    ("exc", "code", "retryable"),
    [
        (MeshError(0x01), "unknown_next_peer", 1),
        (MeshError(0x0E, "bad"), "signature_invalid", 0),
        (CallTimeout("slow"), "timeout", 1),
        (ConfigError("MACULA_X is bad"), "configuration", 0),
        (InvalidArgument("limit: must be 1..200"), "invalid_argument", 0),
        (ValueError("a library's own complaint"), "internal_error", 0),
        (KeyError("missing"), "internal_error", 0),
        (RuntimeError("bug"), "internal_error", 0),
    ],
)
def test_errors_map_in_one_place(exc: BaseException, code: str, retryable: int) -> None:
    error = from_error(exc)
    assert error.is_error
    content = error.structured_content or {}
    assert (content["code"], content["retryable"]) == (code, retryable)
    assert content["next_action"] and "Traceback" not in content["detail"]


def _bare_runtime() -> Runtime:
    """Enough of a runtime for ``run_tool(..., mesh=False)`` without an idempotency key."""
    nothing = cast(Any, None)
    return Runtime(node=nothing, agent=nothing, receipts=nothing, env={}, stations=[])


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (InvalidArgument("name: 'x' is not served here"), "invalid_argument"),
        (KeyError("realm"), "internal_error"),
        (ValueError("invalid literal for int()"), "internal_error"),
    ],
)
def test_only_argument_checks_answer_invalid_argument(
    exc: Exception, code: str, caplog: pytest.LogCaptureFixture
) -> None:
    async def work() -> dict[str, Any]:
        raise exc

    result = asyncio.run(run_tool(_bare_runtime(), "mesh_x", {}, work, mesh=False))
    error = result.structured_content or {}
    assert result.is_error and error["code"] == code
    assert set(error) == {"code", "detail", "retryable", "next_action"}
    assert error["retryable"] == 0 and error["next_action"]
    logged = [r for r in caplog.records if r.levelno >= logging.ERROR and r.exc_info]
    assert bool(logged) == (code == "internal_error")  # bugs keep their traceback, in the log


def test_agent_settings_keep_every_variable(tmp_path: Path) -> None:
    env = {
        "MACULA_HOME": str(tmp_path),
        "MACULA_MCP_NO_CITIZENSHIP": "1",
        "MACULA_MCP_NO_RING": "1",
        "MACULA_MCP_CONTACT_POLICY": "open",
    }
    settings = agent_settings(env, Identity.generate(os.urandom))
    assert settings.citizenship is False
    assert settings.serve_rings is False and settings.policy_override == "open"
    assert agent_settings({"MACULA_HOME": str(tmp_path)}, Identity.generate(os.urandom)).citizenship


def test_idempotency_keys_are_bounded() -> None:
    assert check_key(None) is None and check_key("k") is None
    assert check_key("") and check_key("k" * 121)


def test_receipts_survive_a_restart_and_detect_conflicts(tmp_path: Path) -> None:
    async def scenario() -> None:
        path = tmp_path / "receipts.sqlite3"
        async with await ReceiptStore.open(path) as store:
            await store.store("mesh_publish", "k1", args_digest({"a": 1}), {"seq": 7}, 1)
        async with await ReceiptStore.open(path) as store:
            found = await store.find("mesh_publish", "k1")
            assert found == (args_digest({"a": 1}), {"seq": 7})
            assert found[0] != args_digest({"a": 2})
            assert await store.find("mesh_watch", "k1") is None

    asyncio.run(scenario())
