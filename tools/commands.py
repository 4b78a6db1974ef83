"""The subcommands of ``macula-mcp``: each one's name, one-line description and examples, written
once here and used by the top-level ``--help`` and by each subcommand's own parser.

Invariants:
- light: argparse only, so ``attach`` and ``daemon`` still start in tens of milliseconds;
- every subcommand's parser is made by ``parser_for`` (its description and examples from
  ``COMMANDS``), so ``macula-mcp NAME --help`` says what NAME does and shows it used;
- no user-facing text here names an issue or carries markup.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Final

from macula.help_format import HelpFormatter
from tools.settings import STATIONS_ENV


@dataclass(frozen=True)
class Command:
    name: str
    summary: str  # one line, lower case, no full stop
    examples: tuple[str, ...]


COMMANDS: Final = (
    Command(
        "serve",
        "the MCP server on stdio (what a harness runs; the default with no command)",
        ("macula-mcp serve   # normally started by your MCP client, not by hand",),
    ),
    Command(
        "attach",
        "the MCP server on stdio through this home's daemon (the agent outlives the session)",
        ("macula-mcp attach   # normally started by your MCP client (register --attach)",),
    ),
    Command(
        "register",
        "write the macula entry into the configuration of every MCP client found",
        (
            "macula-mcp register --attach --dry-run   # show the change, write nothing",
            f"{STATIONS_ENV}=ID@HOST:4433 macula-mcp register --attach",
        ),
    ),
    Command(
        "uninstall",
        "take the macula entry back out of each MCP client's configuration",
        ("macula-mcp uninstall --dry-run", "macula-mcp uninstall --harness claude-code"),
    ),
    Command(
        "mcp-config",
        "print the entry to paste into an MCP client's configuration (JSON)",
        ("macula-mcp mcp-config --attach", "macula-mcp mcp-config --http --agent alice"),
    ),
    Command(
        "doctor",
        "check identity, stations, the local station, an MCP round trip and registrations",
        ("macula-mcp doctor", f"{STATIONS_ENV}=ID@HOST:4433 macula-mcp doctor"),
    ),
    Command(
        "demo",
        "two agents (real macula-mcp processes) meet on a throwaway local station",
        ("macula-mcp demo   # about 15 s; touches nothing of yours",),
    ),
    Command(
        "daemon",
        "start, stop or show the local service that attached sessions share",
        ("macula-mcp daemon status", "macula-mcp daemon stop   # then start a session again"),
    ),
    Command(
        "guard",
        "install the git pre-commit hook that refuses commits on paths another agent reserved",
        (
            "macula-mcp guard install   # in a repository; keeps and chains any hook there",
            "macula-mcp guard install --repo ../app --fail-closed",
            "macula-mcp guard uninstall   # puts back the hook that was there",
        ),
    ),
    Command(
        "station",
        "the local station (status, stop), or the commands for a station on another host (init)",
        (
            "macula-mcp station status",
            "macula-mcp station init --public vps.example.org   # run it on that host",
        ),
    ),
    Command(
        "console",
        "print (or open) the URL of this home's console in a browser",
        ("macula-mcp console --open",),
    ),
    Command(
        "owner",
        "show or change what the agent may do: capability switches and presets (owner.toml)",
        (
            "macula-mcp owner show",
            "macula-mcp owner set rpc 0   # no calling or serving procedures",
            "macula-mcp owner preset talk --agent alice",
        ),
    ),
    Command(
        "a2a-agent",
        "list, add or remove the A2A agents a mesh agent may hand tasks to (owner.toml)",
        (
            "macula-mcp a2a-agent add http://127.0.0.1:9999/ --name helper",
            "macula-mcp a2a-agent list",
            "macula-mcp a2a-agent remove a2a:helper",
        ),
    ),
    Command(
        "audit",
        "show, verify or export an agent's audit trail (what it did, what was done to it)",
        (
            "macula-mcp audit show --agent alice --limit 50",
            "macula-mcp audit verify --agent alice   # exit 1 names the first bad entry",
            "macula-mcp audit export --agent alice --out alice-audit.jsonl",
        ),
    ),
    Command(
        "approvals",
        "list what waits for your approval, and approve or deny it",
        (
            "macula-mcp approvals list",
            "macula-mcp approvals approve 3f2a9c0d1e4b5a69 --agent alice",
            "macula-mcp approvals deny 3f2a9c0d1e4b5a69 --reason 'not now'",
        ),
    ),
    Command(
        "http-token",
        "print the bearer token of the daemon's HTTP /mcp endpoint",
        ("macula-mcp http-token", "macula-mcp http-token --agent alice"),
    ),
    Command(
        "a2a-token",
        "make, list or revoke the bearer tokens of A2A clients of this home's agents",
        (
            "macula-mcp a2a-token create crew --agent alice   # prints the token once",
            "macula-mcp a2a-token list",
            "macula-mcp a2a-token revoke crew",
        ),
    ),
)
BY_NAME: Final = {command.name: command for command in COMMANDS}


def epilog(name: str) -> str:
    examples = "\n".join(f"  {line}" for line in BY_NAME[name].examples)
    return f"example{'s' if len(BY_NAME[name].examples) > 1 else ''}:\n{examples}"


def parser_for(name: str, description: str | None = None) -> argparse.ArgumentParser:
    """``macula-mcp NAME``'s parser: its description and examples come from ``COMMANDS``."""
    summary = BY_NAME[name].summary
    return argparse.ArgumentParser(
        prog=f"macula-mcp {name}",
        description=description or f"{summary[0].upper()}{summary[1:]}.",
        epilog=epilog(name),
        formatter_class=HelpFormatter,
    )


def top_parser() -> argparse.ArgumentParser:
    """``macula-mcp --help``: every subcommand with its one line (each has its own --help)."""
    parser = argparse.ArgumentParser(
        prog="macula-mcp",
        description="The Macula mesh for AI agents, as an MCP server. With no command it serves "
        "MCP on stdio (your MCP client starts it); the commands below set it up and check it.",
        epilog="Run `macula-mcp COMMAND --help` for a command's flags and examples.\n"
        "first steps:\n  macula-mcp demo\n  macula-mcp register --attach\n  macula-mcp doctor",
        formatter_class=HelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    for command in COMMANDS:
        sub.add_parser(command.name, help=command.summary, add_help=False)
    return parser
