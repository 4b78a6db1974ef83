"""``macula-mcp``: the MCP server over stdio, plus ``mcp-config``, ``doctor`` and ``demo``.

stdout carries MCP protocol only; every log line goes to stderr. Closing stdin ends the session
gracefully (goodbye published, stores closed).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from macula.errors import MaculaError
from relay.cli import KeyValueFormatter
from tools.launch import server_command


def _logging(level: str = "WARNING") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(KeyValueFormatter())
    logging.basicConfig(
        level=os.environ.get("MACULA_MCP_LOG_LEVEL", level).upper(), handlers=[handler], force=True
    )
    logging.getLogger("quic").setLevel(logging.WARNING)


def serve() -> None:
    from tools.runtime import preflight
    from tools.server import build_server

    _logging()
    try:
        preflight(os.environ)  # bad settings fail before any protocol, in one line
    except MaculaError as exc:
        _fatal(exc)
    try:
        asyncio.run(build_server().run_stdio_async())
    except* MaculaError as group:  # raised later, inside the server's task groups
        _fatal(group.exceptions[0])
    except* KeyboardInterrupt:
        pass


def _fatal(exc: BaseException) -> NoReturn:
    print(f"macula-mcp: {exc}", file=sys.stderr)
    raise SystemExit(2) from None


def mcp_config() -> None:
    command = server_command()
    entry: dict[str, Any] = {"command": command[0], "args": command[1:]}
    stations = os.environ.get("MACULA_MESH_STATIONS")
    if stations:
        entry["env"] = {"MACULA_MESH_STATIONS": stations}
    print(json.dumps({"mcpServers": {"macula": entry}}, indent=2))


async def _doctor() -> list[tuple[str, bool, str]]:
    from mcp import Client, StdioServerParameters

    from macula.config import identity_path
    from macula.keyfile import load_or_create_identity
    from macula.stations import parse_station_list
    from macula.transport import client_configuration, dial
    from tools.runtime import DEFAULT_STATION

    results: list[tuple[str, bool, str]] = []
    env = dict(os.environ)
    try:
        path = identity_path(env)
        identity = load_or_create_identity(path)
        results.append(("identity", True, f"{identity.node_id.hex()} ({path})"))
    except Exception as exc:
        results.append(("identity", False, str(exc)))
    try:
        stations = parse_station_list(env.get("MACULA_MESH_STATIONS", "")) or parse_station_list(
            DEFAULT_STATION
        )
        results.append(("configuration", True, ", ".join(map(str, stations))))
    except MaculaError as exc:
        results.append(("configuration", False, str(exc)))
        stations = []
    for station in stations:
        try:
            async with dial(
                station.host,
                station.port,
                client_configuration(server_name=station.host),
                timeout=3,
            ):
                pass
            results.append((f"station {station}", True, "QUIC handshake ok"))
        except (OSError, TimeoutError) as exc:
            fallback = (
                ""
                if env.get("MACULA_MESH_STATIONS")
                else " (the server will start an embedded station)"
            )
            results.append(
                (
                    f"station {station}",
                    not env.get("MACULA_MESH_STATIONS"),
                    f"unreachable: {exc}{fallback}",
                )
            )
    command = server_command()
    try:
        params = StdioServerParameters(command=command[0], args=command[1:], env=env)
        async with Client(params) as client:
            tools = await client.list_tools()
        results.append(
            (
                "MCP round trip",
                len(tools.tools) > 0,
                f"{len(tools.tools)} tools listed by a fresh server",
            )
        )
    except Exception as exc:
        results.append(("MCP round trip", False, f"{type(exc).__name__}: {exc}"))
    return results


def doctor() -> None:
    _logging("ERROR")
    results = asyncio.run(_doctor())
    for name, good, detail in results:
        print(f"[{'ok  ' if good else 'FAIL'}] {name}: {detail}")
    failed = [name for name, good, _ in results if not good]
    print("all checks passed" if not failed else f"failed: {', '.join(failed)}")
    raise SystemExit(0 if not failed else 1)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="macula-mcp", description="The Macula mesh as an MCP server (stdio)."
    )
    parser.add_argument(
        "command", nargs="?", default="serve", choices=["serve", "mcp-config", "doctor", "demo"]
    )
    args = parser.parse_args(argv)
    if args.command == "serve":
        serve()
    elif args.command == "mcp-config":
        mcp_config()
    elif args.command == "doctor":
        doctor()
    else:
        from tools.demo import main as demo

        demo()


if __name__ == "__main__":
    main()
