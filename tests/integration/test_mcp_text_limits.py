"""Over the real MCP client and a real station: for every text parameter of every listed tool,
a string one character over its listed ``maxLength`` (or the limit the instructions state once,
for ``idempotency_key`` and ``realm``) is refused before the tool runs, as a
structured ``invalid_argument`` naming the parameter and the limit; one at the limit is not
refused for its length."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from relay.station.station import Station
from support.agentkit import ERROR_KEYS, agent
from tools.server.schema import LIMIT_SAID_ONCE

pytestmark = pytest.mark.anyio


def text_limit(param: str, spec: dict[str, Any]) -> int | None:
    """The listed limit; for ``idempotency_key`` and ``realm`` the one their shared rule in
    the server instructions states (``LIMIT_SAID_ONCE``)."""
    for arm in spec.get("anyOf", [spec]):
        if arm.get("type") == "string":
            return int(arm["maxLength"]) if param not in LIMIT_SAID_ONCE else LIMIT_SAID_ONCE[param]
    return None


async def test_every_over_long_text_is_refused_naming_its_limit(
    station: Station, tmp_path: Path
) -> None:
    checked = 0
    async with agent(station, tmp_path / "alice", "legacy") as alice:
        for tool in (await alice.client.list_tools()).tools:
            for param, spec in tool.input_schema.get("properties", {}).items():
                limit = text_limit(param, spec)
                if limit is None:
                    continue
                error = await alice.refused(tool.name, **{param: "x" * (limit + 1)})
                assert set(error) == ERROR_KEYS | {"problems"}, error
                assert error["code"] == "invalid_argument", (tool.name, param, error)
                assert f"{param}: at most {limit} characters" in error["detail"], (
                    tool.name,
                    param,
                    error["detail"],
                )
                checked += 1
        assert checked >= 90, checked
        # at the limit: refused for other reasons maybe, never for its length
        at_limit = await alice.refused("mesh_publish", topic="t" * 256, fact=1, realm="x" * 129)
        assert "topic:" not in at_limit["detail"] and "realm: at most 128" in at_limit["detail"]
