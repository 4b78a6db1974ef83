"""Tool descriptions are data (``tools/groups/descriptions/<group>.toml``): each registered tool has
exactly one full and one terse text there, in its own group's file, and no file describes a
tool that does not exist. (What the texts must say: tests/integration/
test_mcp_tools_list_budget.py.)"""

from __future__ import annotations

import tomllib
from importlib import resources

from tools.server.context import description_files
from tools.server.server import build_server


def test_every_tool_is_described_once_in_its_groups_file_and_nothing_else_is() -> None:
    app = build_server({"MACULA_HOME": "/nonexistent"})
    tools = {tool.name: tool for tool in app._tool_manager.list_tools()}
    texts = description_files()
    assert texts.keys() == tools.keys()
    folder = resources.files("tools.groups").joinpath("descriptions")
    for name, tool in tools.items():
        group = tool.fn.__module__.rsplit(".", 1)[-1]
        table = tomllib.loads(folder.joinpath(f"{group}.toml").read_text(encoding="utf-8"))
        assert set(table[name]) == {"full", "terse"}, name
        full, terse = texts[name]
        assert full.strip() == full and terse.strip() == terse and full and terse, name
        assert len(terse) <= len(full), name


def test_the_served_description_follows_the_terse_setting() -> None:
    texts = description_files()
    for terse in (False, True):
        env = {"MACULA_HOME": "/nonexistent", "MACULA_MCP_TERSE_TOOLS": str(int(terse))}
        app = build_server(env)
        for tool in app._tool_manager.list_tools():
            assert tool.description == texts[tool.name][int(terse)], tool.name
