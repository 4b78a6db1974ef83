"""The MCP prompt texts (``*.md`` beside this file) and their loader."""

from __future__ import annotations

from importlib import resources

NAMES = (
    "help",
    "help_identity",
    "help_wire_format",
    "help_watch",
    "help_presence",
    "help_conversations",
    "help_serve",
    "help_install",
)


def text(name: str) -> str:
    """The prompt ``name`` (one of ``NAMES``) as shipped with the package."""
    if name not in NAMES:
        raise KeyError(f"no prompt named {name!r}")
    return resources.files(__package__).joinpath(f"{name}.md").read_text(encoding="utf-8")
