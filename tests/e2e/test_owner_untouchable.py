"""Nothing the model can call changes the owner's policy: every tool ``macula-mcp`` lists (read
from ``tools/list``, so a tool added later is covered too) is called with hostile arguments
(the file's absolute path, ``../owner.toml``, huge strings and numbers, wrong types, extra
keys that name the policy) and ``owner.toml`` is byte-identical afterwards, as are its mode,
its mtime and the tools listed."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from relay.station.station import Station
from support.mcpkit import server_env, server_params

pytestmark = pytest.mark.anyio

POLICY = """# the owner's own words: no tool may touch this file
preset = "full"

[tools]
mesh_serve = 1

[agents.ada]
preset = "full"

[approvals]
ttl_s = 60

[a2a]
port = 0
"""
CALL_TIMEOUT_S = 30.0
VARIANTS = ("within_bounds", "absolute", "relative", "huge", "wrong_types", "extra_keys")


def kinds(spec: dict[str, Any]) -> set[str]:
    found = {spec["type"]} if isinstance(spec.get("type"), str) else set(spec.get("type") or [])
    for arm in spec.get("anyOf", []):
        found |= kinds(arm)
    return found or {"string"}


def hostile(spec: dict[str, Any], variant: str, path: Path) -> Any:
    """One hostile value for a parameter of schema ``spec``."""
    kind = kinds(spec)
    absolute, relative = str(path), "../owner.toml"
    if variant == "within_bounds":  # passes the schema, so the tool itself runs
        return plausible(spec, kind, absolute)
    if variant == "wrong_types":
        return {"owner.toml": [absolute], "preset": "full"} if "object" not in kind else 7
    if "string" in kind:
        return {"absolute": absolute, "relative": relative, "huge": "A" * 200_000}.get(
            variant, absolute
        )
    if "integer" in kind or "number" in kind:
        return {"absolute": 0, "relative": -1, "huge": 2**63}.get(variant, 0)
    if "array" in kind:
        return [absolute, relative, "x" * 10_000] if variant != "absolute" else [absolute]
    if "object" in kind:
        return {absolute: relative, "path": absolute, "tools": {"mesh_serve": 0}}
    return absolute


def plausible(spec: dict[str, Any], kind: set[str], absolute: str) -> Any:
    arm = next((a for a in spec.get("anyOf", []) if a.get("type") in kind), spec)
    if "string" in kind:
        return absolute[: arm.get("maxLength", len(absolute))] or "x"
    if "integer" in kind or "number" in kind:
        low = max(arm.get("minimum", 0), arm.get("exclusiveMinimum", -1) + 1)
        return min(low, arm.get("maximum", low))
    if "array" in kind:
        return [absolute]
    if "object" in kind:
        return {"path": absolute}
    return absolute


def arguments(schema: dict[str, Any], variant: str, path: Path) -> dict[str, Any]:
    args = {
        name: hostile(spec, variant, path)
        for name, spec in (schema.get("properties") or {}).items()
    }
    if variant == "extra_keys":  # names no tool takes, naming the policy
        args |= {"owner_toml": str(path), "policy": "preset = 'read-only'", "preset": "read-only"}
    return args


def fingerprint(path: Path) -> tuple[bytes, int, int]:
    st = path.stat()
    return path.read_bytes(), st.st_mode, st.st_mtime_ns


async def test_no_tool_changes_the_policy_whatever_its_arguments(
    station: Station, tmp_path: Path
) -> None:
    home = tmp_path / "h"
    home.mkdir(mode=0o700)
    path = home / "owner.toml"
    path.write_text(POLICY)
    os.chmod(path, 0o600)
    before = fingerprint(path)
    env = server_env(home, station.endpoint, MACULA_MCP_AGENT="ada", MACULA_MCP_CHANNEL="0")
    called: dict[str, int] = {}
    outcomes: dict[str, int] = {}
    async with Client(server_params(env), mode="legacy") as client:
        tools = (await client.list_tools()).tools
        assert len(tools) >= 40
        for variant in VARIANTS:
            for tool in tools:
                args = arguments(tool.input_schema, variant, path)
                with anyio.fail_after(CALL_TIMEOUT_S):
                    result = await client.call_tool(tool.name, args)
                code = (result.structured_content or {}).get("code") if result.is_error else "ok"
                outcomes[str(code)] = outcomes.get(str(code), 0) + 1
                called[tool.name] = called.get(tool.name, 0) + 1
                assert fingerprint(path) == before, (tool.name, variant)
        assert {t.name for t in (await client.list_tools()).tools} == {t.name for t in tools}
    assert set(called) == {t.name for t in tools} and set(called.values()) == {len(VARIANTS)}
    assert fingerprint(path) == before
    ran = sum(count for code, count in outcomes.items() if code != "invalid_argument")
    assert ran >= 20, outcomes  # the tools themselves ran, not only the argument checks
    assert sorted(p.name for p in home.glob("owner.toml*")) == ["owner.toml"]  # no stray copy
