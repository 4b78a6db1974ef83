"""Written for tool search: the few tools a harness keeps loaded, and the key that asks it to.

Claude Code defers MCP tools behind tool search: at start the model sees each tool's name and
the server's ``instructions``; a deferred tool's description and schema load only when the
model searches for it. A tool whose ``_meta`` holds ``"anthropic/alwaysLoad": true`` stays
loaded (found in @anthropic-ai/claude-code 2.1.332: its MCP client reads
``tool._meta["anthropic/alwaysLoad"] === true``, and its server-config docs say a tool listed
with it set to false is deferred even when the server's tools are always loaded). Other clients
ignore an unknown ``_meta`` key (MCP: ``_meta`` is for extensions).

Invariants:
- only ``ALWAYS_LOADED`` carry the key, each exactly once; every other tool is left deferred.
- marking never changes a tool's name, description, schema or annotations.
"""

from __future__ import annotations

from typing import Any, Final

ALWAYS_LOAD_KEY: Final = "anthropic/alwaysLoad"

# what an agent on the mesh needs at once: announce itself, read and wait for messages, speak,
# and ring another agent (the way into a room); the rest is found by search
ALWAYS_LOADED: Final = ("mesh_hello", "mesh_read_inbox", "mesh_wait_room", "mesh_say", "mesh_ring")


def mark_always_loaded(app: Any) -> None:
    """Put ``_meta["anthropic/alwaysLoad"] = true`` on each of ``ALWAYS_LOADED`` in ``app``
    (an ``MCPServer`` whose groups are registered). A server built with fewer groups (tests
    do) marks those it has; tests/integration/test_mcp_tool_search.py checks the full server
    carries all five, so a renamed tool is still caught."""
    for name in ALWAYS_LOADED:
        tool = app._tool_manager.get_tool(name)
        if tool is None:
            continue
        tool.meta = {**(tool.meta or {}), ALWAYS_LOAD_KEY: True}
