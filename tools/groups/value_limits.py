"""The tool boundary's check on a JSON value bound for the wire (``mesh_call`` args, a
``mesh_publish`` fact): nested deeper than a frame can carry, it is refused by argument name
before anything recursive (the receipts' digest, the encoders) walks it."""

from __future__ import annotations

from mcp_types import CallToolResult

from macula.client.send_limits import MAX_VALUE_DEPTH, value_depth
from tools.server.results import fail


def too_deep(name: str, value: object) -> CallToolResult | None:
    """A ``too_deep`` error when ``value`` nests more than a frame's payload may, else None."""
    depth = value_depth(value)
    if depth <= MAX_VALUE_DEPTH:
        return None
    return fail(
        "too_deep",
        f"{name}: nests more than {MAX_VALUE_DEPTH} levels of lists/maps ({depth} seen)",
        retryable=False,
        next_action=f"flatten {name} to at most {MAX_VALUE_DEPTH} levels and call again",
    )
