"""The owner's policy file read and applied (pure): presets, precedence, the key that decided
each tool, other features' tables passed through, and every malformed file failing closed with
its line and key."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.owner.policy import MALFORMED_SWITCH, Policy, Problem, effective, line_of, parse
from tools.owner.presets import ALL_TOOLS, GROUP_TOOLS, PRESETS, READ_ONLY, TALK
from tools.server.server import build_server

pytestmark = pytest.mark.anyio


def policy(text: str) -> Policy:
    found = parse(text, "owner.toml")
    assert isinstance(found, Policy), found
    return found


def problem(text: str) -> Problem:
    found = parse(text, "owner.toml")
    assert isinstance(found, Problem), found
    return found


async def test_the_groups_are_the_servers_own() -> None:
    """Every tool the server registers is in exactly one group of the table, by its module."""
    from mcp.server.mcpserver import MCPServer

    from tools.server.context import Descriptions
    from tools.server.server import GROUPS

    grouped: dict[str, tuple[str, ...]] = {}
    for module in GROUPS:
        app = MCPServer(name="g")
        module.register(app, Descriptions(terse=False))
        names = tuple(t.name for t in app._tool_manager.list_tools())
        if names:
            grouped[module.__name__.rsplit(".", 1)[-1]] = names
    assert grouped == dict(GROUP_TOOLS)
    listed = {t.name for t in await build_server({"MACULA_HOME": "/nonexistent"}).list_tools()}
    assert listed == ALL_TOOLS


def test_no_file_and_an_empty_file_are_full() -> None:
    for found in (None, policy(""), policy("# nothing yet\n")):
        switches = effective(found)
        assert switches.preset == "full" and set(switches.on.values()) == {1}


def test_read_only_writes_nothing_and_talk_adds_presence_rooms_rings() -> None:
    writers = {"mesh_say", "mesh_hello", "mesh_serve", "mesh_call", "mesh_publish", "mesh_put",
               "mesh_remember", "mesh_task_send", "mesh_ring", "mesh_open_room",
               "mesh_reserve_paths", "mesh_join_realm", "mesh_trust_agent"}  # fmt: skip
    assert not READ_ONLY & writers
    assert {"mesh_read_inbox", "mesh_recall", "mesh_search", "mesh_task_get"} <= READ_ONLY
    assert (
        set(GROUP_TOOLS["presence"] + GROUP_TOOLS["rooms"] + GROUP_TOOLS["rings"]) - READ_ONLY
        == TALK - READ_ONLY
    )
    assert not TALK & {"mesh_serve", "mesh_call", "mesh_publish", "mesh_task_send", "mesh_put"}
    for name, tools in PRESETS.items():
        switches = effective(policy(f'preset = "{name}"'))
        assert {t for t, on in switches.on.items() if on} == tools


def test_precedence_preset_groups_tools_then_the_agents_table() -> None:
    text = """
preset = "talk"
[groups]
rpc = 1
[tools]
mesh_serve = 0
[agents.alice]
[agents.alice.tools]
mesh_say = 0
[agents.bob]
preset = "read-only"
[agents.bob.groups]
tasks = 1
"""
    found = policy(text)
    home = effective(found)
    assert home.on["mesh_call"] == 1 and home.decided_by["mesh_call"] == "groups.rpc"
    assert home.on["mesh_serve"] == 0 and home.decided_by["mesh_serve"] == "tools.mesh_serve"
    assert home.on["mesh_say"] == 1 and home.decided_by["mesh_say"] == "preset talk"
    alice = effective(found, "alice")
    assert (
        alice.on["mesh_say"] == 0 and alice.switch_of("mesh_say") == "agents.alice.tools.mesh_say"
    )
    assert alice.on["mesh_call"] == 1  # the home's switches still count for alice
    bob = effective(found, "bob")  # his preset starts over: the home's rpc=1 no longer counts
    assert bob.preset == "read-only" and bob.on["mesh_call"] == 0 and bob.on["mesh_say"] == 0
    assert bob.on["mesh_task_send"] == 1 and bob.decided_by["mesh_task_send"] == (
        "agents.bob.groups.tasks"
    )
    assert effective(found, "carol").on == home.on  # no table: the home's


def test_other_features_tables_pass_through_unchecked() -> None:
    text = """
[approvals]
anything = "goes"
ttl_s = 3600
[a2a.door]
port = 1
[agents.alice.approvals]
x = [1, 2]
[agents.alice.a2a]
y = true
"""
    assert effective(policy(text)).preset == "full"


@pytest.mark.parametrize(
    ("text", "line", "key"),
    [
        ('preset = "fast"\n', 1, "preset"),
        ("preset = 1\n", 1, "preset"),
        ("\n[tools]\nmesh_say = 2\n", 3, "tools.mesh_say"),
        ("[tools]\nmesh_say = true\n", 2, "tools.mesh_say"),
        ('[tools]\nmesh_say = "0"\n', 2, "tools.mesh_say"),
        ("[tools]\nmesh_nope = 0\n", 2, "tools.mesh_nope"),
        ("[groups]\n\nnope = 0\n", 3, "groups.nope"),
        ("colour = 1\n", 1, "colour"),
        ("tools = 1\n", 1, "tools"),
        ('[agents.alice]\npreset = "full"\nmood = 1\n', 3, "agents.alice.mood"),
        ('[agents."bad name"]\n', 1, "agents.bad name"),
        ("[agents.alice.tools]\nmesh_say = 3\n", 2, "agents.alice.tools.mesh_say"),
        ("agents = 3\n", 1, "agents"),
        ("[tools]\nmesh_say = 0\nmesh_say = 1\n", 3, ""),
        ("[tools\nmesh_say = 0\n", 1, ""),
        ("preset = = 1\n", 1, "preset"),
    ],
)
def test_a_malformed_file_names_its_line_and_key_and_turns_everything_off(
    text: str, line: int, key: str
) -> None:
    found = problem(text)
    assert found.line == line, found
    if key:
        assert found.key == key, found
    switches = effective(found, "alice")
    assert set(switches.on.values()) == {0} and switches.on.keys() == ALL_TOOLS
    assert switches.switch_of("mesh_say") == MALFORMED_SWITCH
    assert not switches.allows("mesh_say") and not switches.allows("mesh_not_yet_written")
    assert f"owner.toml:{line}" in found.text()


def test_line_of_finds_headers_keys_and_dotted_keys() -> None:
    text = (
        "# c\npreset = 'talk'\ntools.mesh_say = 0\n[agents.alice]\n[agents.alice.tools]\n x = 1\n"
    )
    assert line_of(text, ("preset",)) == 2
    assert line_of(text, ("tools", "mesh_say")) == 3
    assert line_of(text, ("agents", "alice")) == 4
    assert line_of(text, ("agents", "alice", "tools", "x")) == 6
    assert line_of(text, ("agents", "alice", "groups", "x")) == 4  # the nearest table
    assert line_of(text, ("nowhere",)) == 0


def test_the_view_has_no_booleans_and_names_what_is_off() -> None:
    view = effective(policy("[groups]\nrpc = 0\n")).view()
    assert view["off"] == {t: "groups.rpc" for t in sorted(GROUP_TOOLS["rpc"])}
    assert view["groups"]["rpc"] == 0 and view["malformed"] == 0
    assert "True" not in repr(view) and "False" not in repr(view)


@pytest.mark.parametrize("terse", [False, True])
async def test_a_narrower_preset_lists_fewer_bytes(terse: bool, tmp_path: Path) -> None:
    """``tools/list`` bytes per preset (docs/owner.md has the figures): each narrower preset
    sends less, and the switches add nothing to what a listed tool costs."""
    from mcp_types import ListToolsResult

    from tools.owner.store import policy_path, set_preset

    sizes: dict[str, int] = {}
    for preset in ("full", "talk", "read-only"):
        home = tmp_path / f"{preset}-{terse}"
        set_preset(policy_path(home), preset)
        env = {"MACULA_HOME": str(home), "MACULA_MCP_TERSE_TOOLS": str(int(terse))}
        tools = await build_server(env).list_tools()
        assert {t.name for t in tools} == PRESETS[preset]
        sizes[preset] = len(
            ListToolsResult(tools=tools).model_dump_json(by_alias=True, exclude_none=True)
        )
    plain = await build_server(
        {"MACULA_HOME": "/nonexistent", "MACULA_MCP_TERSE_TOOLS": str(int(terse))}
    ).list_tools()
    assert sizes["full"] == len(
        ListToolsResult(tools=plain).model_dump_json(by_alias=True, exclude_none=True)
    )
    assert sizes["read-only"] < sizes["talk"] < sizes["full"], sizes


async def test_mesh_policy_shows_the_switches_even_while_the_mesh_is_not_usable(
    tmp_path: Path,
) -> None:
    import json

    from mcp import Client

    from tools.server.runtime_gate import Problem

    (tmp_path / "owner.toml").write_text("[tools]\nmesh_say = 3\n")
    problem = Problem("configuration", "no station", "fix it", retryable=0)
    app = build_server({"MACULA_HOME": str(tmp_path)}, problem=problem, only_problem=True)
    async with Client(app) as client:
        read = await client.read_resource("mesh://policy")
        view = json.loads(read.contents[0].text)  # type: ignore[union-attr]
        assert view["switches"]["malformed"] == 1 and view["switches"]["on"] == []
        assert view["switches"]["problem"]["line"] == 2 and "configuration" in view["error"]
        assert (await client.list_tools()).tools == []
