"""Every benchmark, one entry point: ``uv run python scripts/bench.py SUBCOMMAND [OPTIONS]``.

``uv run python scripts/bench.py --help`` lists the subcommands, ``... bench.py SUBCOMMAND
--help`` the options of one. Each subcommand is one module ``scripts/bench_*.py`` with a
``main(argv)``; they share ``bench_common`` (argument parsing, timing, percentiles, printing,
child processes) and ``bench_peers`` (nats-server, amqtt). What each figure means and the
latest figures: docs/performance.md.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

# subcommand -> (module, arguments put before the user's, one line of help)
SUBCOMMANDS: dict[str, tuple[str, tuple[str, ...], str]] = {
    "station": ("bench_station", (), "ours vs nats-server vs amqtt: every figure, issue 15 goals"),
    "client": ("bench_station", ("--only", "client"), "station's client figures only (RPC, e2e)"),
    "client-path": ("bench_client_path", (), "the client's CPU per message, publish/deliver/RPC"),
    "station-cpu": ("bench_station_cpu", (), "the router core's CPU per PUBLISH and per CALL"),
    "station-sig": ("bench_station_sig", (), "router core: signatures and sends per message"),
    "backend-cpu": ("bench_backend_cpu", (), "CPU per message and per MiB, one QUIC backend"),
    "content-cpu": ("bench_content_cpu", (), "content put+get: station and client CPU per MiB"),
    "wire": ("bench_wire", (), "frame encode+sign and decode+verify rates, BLAKE3, MCID"),
    "cbor": ("bench_cbor", (), "CBOR decode/encode and parse_frame, µs per frame"),
    "mesh": ("bench_mesh", (), "three stations: start -> linked pairwise through the DHT"),
    "restart": ("bench_restart", (), "station SIGKILLed and restarted -> its client back"),
    "attach": ("bench_attach", (), "macula-mcp first byte and first tools/list, cold and warm"),
    "agent": ("bench_agent", (), "mesh_say → mesh_wait_room through two macula-mcp (--presence)"),
    "search": ("bench_search", (), "mesh_search: query p50/p99 at 100k messages, index cost"),
    "profile": ("bench_profile", (), "summarise collapsed stacks (py-spy) by area"),
}


def usage() -> str:
    lines = [__doc__.splitlines()[0] if __doc__ else "", "", "subcommands:"]
    lines += [f"  {name:<13} {text}" for name, (_, _, text) in SUBCOMMANDS.items()]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in {"-h", "--help"}:
        print(usage())
        return
    if args[0] not in SUBCOMMANDS:
        print(f"bench.py: unknown subcommand {args[0]!r}\n\n{usage()}", file=sys.stderr)
        sys.exit(2)
    module, before, _ = SUBCOMMANDS[args[0]]
    importlib.import_module(module).main([*before, *args[1:]])


if __name__ == "__main__":
    main()
